"""Validation clips of video families, as files a browser opens: clip-NN.webp (an animated WebP
at the validation frame rate, looping) and clip-NN-frames.png (the frames side by side, the
prompt in its text), plus grid.png (one strip per row). Each written atomically."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from simpletuner.common.atomic import atomic_write_with
from simpletuner.models.pipelines import make_grid, save_png_atomically


def frame_strip(frames: list[Image.Image]) -> Image.Image:
    """The frames in one row, left to right."""
    return make_grid(frames, columns=len(frames))


def save_animated_webp(frames: list[Image.Image], path: Path, framerate: int) -> None:
    """Lossless, looping; each frame shown 1000 / framerate ms (WebP counts milliseconds)."""
    first, *rest = [frame.convert("RGB") for frame in frames]
    atomic_write_with(path, lambda temporary: first.save(
        temporary, format="WEBP", save_all=True, append_images=rest, loop=0, lossless=True,
        duration=max(1, round(1000 / framerate))))


def save_validation_clips(clips: list[list[Image.Image]], prompts: list[str], folder: Path,
                          framerate: int) -> list[Path]:
    """clip-00.webp and clip-00-frames.png for each clip, then grid.png; returns the paths,
    grid last."""
    if len(clips) != len(prompts) or not clips:
        raise ValueError(f"need one prompt per clip, got {len(clips)} clips and "
                         f"{len(prompts)} prompts")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, strips = [], []
    for index, (frames, prompt) in enumerate(zip(clips, prompts)):
        paths.append(folder / f"clip-{index:02d}.webp")
        save_animated_webp(frames, paths[-1], framerate)
        strips.append(frame_strip(frames))
        paths.append(folder / f"clip-{index:02d}-frames.png")
        save_png_atomically(strips[-1], paths[-1], prompt)
    paths.append(folder / "grid.png")
    save_png_atomically(make_grid(strips, columns=1), paths[-1])
    return paths
