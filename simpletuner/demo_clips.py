"""The demo video dataset: short clips of a coloured shape moving across a plain background,
each with a caption that says what moves where ("a red circle moving right on a blue
background"), generated deterministically on first use (lossless H.264: a lossy encode's
rate control came out differently in a process that had imported torch).

``python -m simpletuner.demo_clips FOLDER`` writes NNN-<colour>-<shape>-<direction>.mp4 (H.264,
16 fps, 17 or 21 frames, two sizes) and a .txt caption beside each, every file atomically; the
marker file is written last, so an interrupted generation is redone. ./train.sh
config/video/config.json trains the tiny Wan on them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw

from simpletuner.common.atomic import atomic_write_text, atomic_write_with
from simpletuner.demo_data import COLOURS, generate_main, marker_matches, write_marker

VERSION = 1
CLIP_COUNT = 24
FPS = 16
SIZES = [(64, 48), (48, 64)]   # (width, height): landscape and portrait
FRAME_COUNTS = [17, 21]        # Wan's 4n+1, about a second
SHAPES = ["circle", "square"]
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}
MARKER = ".demo-clips.json"
_SEED = 20260601


@dataclass(frozen=True)
class DemoClip:
    stem: str
    size: tuple[int, int]
    frames: int
    shape: str
    colour: str
    background: str
    direction: str
    start: tuple[float, float]   # the shape's centre in the first frame, in pixels
    radius: float

    @property
    def caption(self) -> str:
        article = "an" if self.colour[0] in "aeiou" else "a"
        return (f"{article} {self.colour} {self.shape} moving {self.direction} on a "
                f"{self.background} background")

    def centre(self, index: int) -> tuple[float, float]:
        """Where the shape is in frame ``index``: from one side towards the other."""
        dx, dy = DIRECTIONS[self.direction]
        width, height = self.size
        travel = (width if dx else height) - 2 * self.radius - 2
        step = travel / (self.frames - 1)
        return self.start[0] + dx * step * index, self.start[1] + dy * step * index


def demo_clips() -> list[DemoClip]:
    """The full plan; only ``Random.random()`` (stable across Python versions) is drawn."""
    rng = random.Random(_SEED)
    names = list(COLOURS)

    def pick(options):
        return options[int(rng.random() * len(options))]

    plan = []
    for i in range(CLIP_COUNT):
        direction = list(DIRECTIONS)[i % len(DIRECTIONS)]
        width, height = SIZES[(i // len(DIRECTIONS)) % len(SIZES)]
        colour = pick(names)
        background = pick([n for n in names if n != colour])
        radius = 0.2 * min(width, height)
        dx, dy = DIRECTIONS[direction]
        # start at the side it leaves from; across the motion, anywhere inside
        x = (radius + 1 if dx > 0 else width - radius - 1) if dx else (
            radius + 1 + rng.random() * (width - 2 * radius - 2))
        y = (radius + 1 if dy > 0 else height - radius - 1) if dy else (
            radius + 1 + rng.random() * (height - 2 * radius - 2))
        shape = pick(SHAPES)
        frames = FRAME_COUNTS[(i // 8) % len(FRAME_COUNTS)]  # buckets of 8, 8, 4 and 4 clips
        stem = f"{i:03d}-{colour}-{shape}-{direction}"
        plan.append(DemoClip(stem, (width, height), frames, shape, colour, background,
                             direction, (x, y), radius))
    return plan


def render_frame(clip: DemoClip, index: int) -> np.ndarray:
    """Frame ``index`` as H x W x 3 uint8."""
    image = Image.new("RGB", clip.size, COLOURS[clip.background])
    (cx, cy), r = clip.centre(index), clip.radius
    box = (cx - r, cy - r, cx + r, cy + r)
    draw = ImageDraw.Draw(image)
    if clip.shape == "circle":
        draw.ellipse(box, fill=COLOURS[clip.colour])
    else:
        draw.rectangle(box, fill=COLOURS[clip.colour])
    return np.asarray(image)


def write_clip(clip: DemoClip, path: Path) -> None:
    """H.264 in MP4, lossless (qp 0), one encoder thread."""
    def write(temporary: str) -> None:
        with av.open(temporary, "w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=Fraction(FPS))
            stream.width, stream.height, stream.pix_fmt = *clip.size, "yuv420p"
            stream.thread_count = 1
            stream.options = {"qp": "0"}  # lossless: the same frames whatever the float path
            for index in range(clip.frames):
                frame = av.VideoFrame.from_ndarray(render_frame(clip, index), format="rgb24")
                frame.pts, frame.time_base = index, Fraction(1, FPS)
                container.mux(stream.encode(frame))
            container.mux(stream.encode())
    atomic_write_with(path, write)


def _expected_marker() -> dict:
    return {"version": VERSION, "clips": CLIP_COUNT}


def is_complete(folder: Path) -> bool:
    """The marker matches this generator, and every clip and caption is present."""
    return marker_matches(folder / MARKER, _expected_marker()) and all(
        (folder / f"{c.stem}{ext}").is_file() for c in demo_clips() for ext in (".mp4", ".txt"))


def ensure_demo_clips(folder: str | Path) -> Path:
    """Generate the demo clips into ``folder`` unless they are already complete."""
    folder = Path(folder)
    if is_complete(folder):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for clip in demo_clips():
        write_clip(clip, folder / f"{clip.stem}.mp4")
        atomic_write_text(folder / f"{clip.stem}.txt", clip.caption + "\n")
    write_marker(folder / MARKER, _expected_marker())
    return folder


def main(argv: list[str] | None = None) -> int:
    return generate_main(ensure_demo_clips, "simpletuner.demo_clips", argv)


if __name__ == "__main__":
    raise SystemExit(main())
