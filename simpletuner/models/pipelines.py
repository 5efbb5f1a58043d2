"""Validation images and the exported pipeline, for any adapter's build_pipeline() result.

Images come from a fixed-seed generator per prompt, so the same weights give the same images
and a prompt's image does not depend on which prompts come before it. Files are written under
a temporary name and renamed, so a crash never leaves a half-written PNG or pipeline folder."""

from __future__ import annotations

import inspect
import math
import os
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from tqdm.auto import tqdm

from simpletuner.common.atomic import (atomic_write_with, give_umask_modes, naming_path,
                                       staging_folder)


def size_arguments(pipeline, width: int, height: int) -> dict:
    """height and width for a pipeline whose call takes them; none for one that sizes its
    output from its input image (HunyuanVideo 1.5's image-to-video: the image's aspect ratio at
    the transformer's target_size), which is given the image at the asked size instead."""
    if "height" in inspect.signature(pipeline.__call__).parameters:
        return {"height": height, "width": width}
    return {}


@contextmanager
def _eval_mode(pipeline):
    """Switch every network of the pipeline to eval() for sampling, then restore train flags."""
    modules = [m for m in pipeline.components.values() if isinstance(m, torch.nn.Module)]
    flags = [m.training for m in modules]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for module, flag in zip(modules, flags):
            module.train(flag)


def generate_validation_images(pipeline, prompts: list[str], *, resolution: int | tuple[int, int],
                               num_inference_steps: int, guidance_scale: float | None = 7.5,
                               seed: int | list[int] = 0,
                               autocast_dtype: torch.dtype | None = None,
                               negative_prompt: str | None = None, keep=None,
                               input_images: list[Image.Image] | None = None,
                               **pipeline_arguments) -> list:
    """One image per prompt at ``resolution`` (a side, or (width, height); a pipeline that takes
    no size, LongCat-Image-Edit, samples at its reference's shape); ``keep`` picks what
    is kept of each pipeline output (default ``first_image``; ``first_clip``). ``input_images``:
    each prompt's input image, for image-to-video pipelines. Each prompt gets its
    own CPU generator seeded with ``seed`` (or its own of a list of seeds, one per prompt):
    identical on every device and run. Pass the frozen
    components' dtype as ``autocast_dtype`` when it differs from the trainable network's.
    ``negative_prompt`` and ``pipeline_arguments`` (guidance_rescale, skip_guidance_layers...)
    are passed only when given (pipelines differ in what they accept)."""
    extra = {} if negative_prompt is None else {"negative_prompt": negative_prompt}
    if guidance_scale is not None:  # None: the pipeline has no such argument (Qwen-Image 2.1)
        extra["guidance_scale"] = guidance_scale
    extra.update(pipeline_arguments)
    width, height = (resolution, resolution) if isinstance(resolution, int) else resolution
    sized = size_arguments(pipeline, width, height)
    if input_images is not None and not sized:  # the pipeline sizes its output from these
        input_images = [image.resize((width, height), Image.LANCZOS) for image in input_images]
    device = pipeline.device
    autocast = (torch.autocast(device.type, dtype=autocast_dtype)
                if autocast_dtype not in (None, torch.float32) else nullcontext())
    pipeline.set_progress_bar_config(disable=True)
    images = []
    seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
    with _eval_mode(pipeline), torch.no_grad(), autocast:
        for index, prompt in enumerate(tqdm(prompts, desc="validation images", leave=False)):
            generator = torch.Generator(device="cpu").manual_seed(seeds[index])
            given = {} if input_images is None else {"image": input_images[index]}
            result = pipeline(prompt=prompt, **sized,
                              num_inference_steps=num_inference_steps,
                              generator=generator, **given, **extra)
            images.append((keep or first_image)(result))
    return images


def first_image(result) -> Image.Image:
    """The image of a pipeline's output; a video pipeline's (WanPipeline: ``frames``, one clip
    per prompt) gives the first frame of its first clip. Kandinsky 5's image pipelines name
    their images ``image``."""
    frames = getattr(result, "frames", None)
    if frames is not None:
        return frames[0][0]
    images = getattr(result, "images", None)
    return (images if images is not None else result.image)[0]


def first_clip(result) -> list[Image.Image]:
    """The frames of a video pipeline's first clip (``output_type`` 'pil')."""
    return list(result.frames[0])


def first_clip_and_sound(result) -> tuple[list[Image.Image], np.ndarray]:
    """The first clip's frames and its sound, [channels, samples] float32 (an audio-video
    pipeline's ``audio``)."""
    return list(result.frames[0]), result.audio[0].float().cpu().numpy()


def make_grid(images: list[Image.Image], columns: int | None = None) -> Image.Image:
    """Images side by side in rows of ``columns`` (default: a near-square grid)."""
    columns = columns or math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / columns)
    cell_w = max(image.width for image in images)
    cell_h = max(image.height for image in images)
    grid = Image.new("RGB", (columns * cell_w, rows * cell_h), "white")
    for index, image in enumerate(images):
        grid.paste(image, ((index % columns) * cell_w, (index // columns) * cell_h))
    return grid


def save_png_atomically(image: Image.Image, path: Path, prompt: str | None = None) -> None:
    info = PngInfo()
    if prompt is not None:
        info.add_text("prompt", prompt)  # the caption travels with the file
    atomic_write_with(path, lambda temporary: image.save(temporary, format="PNG", pnginfo=info))


def save_validation_images(images: list[Image.Image], prompts: list[str], folder: Path
                           ) -> list[Path]:
    """Write image-00.png, image-01.png, ... (prompt in the PNG text) and grid.png into
    ``folder``; return the paths, grid last."""
    if len(images) != len(prompts) or not images:
        raise ValueError(f"need one prompt per image, got {len(images)} images and "
                         f"{len(prompts)} prompts")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (image, prompt) in enumerate(zip(images, prompts)):
        paths.append(folder / f"image-{index:02d}.png")
        save_png_atomically(image, paths[-1], prompt)
    paths.append(folder / "grid.png")
    save_png_atomically(make_grid(images), paths[-1])
    return paths


def export_pipeline(pipeline, output_dir: Path, name: str = "pipeline") -> Path:
    """Save a complete diffusers pipeline to ``output_dir/name`` (safetensors) that
    DiffusionPipeline.from_pretrained loads. Written to a temporary folder first; an earlier
    export is only replaced once the new one is complete."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / name
    staging = staging_folder(output_dir, f".{name}-")
    try:
        with naming_path(final):  # a full disk is named here, not only by its errno
            pipeline.save_pretrained(staging, safe_serialization=True)
        give_umask_modes(staging)
        if final.exists():
            retired = staging_folder(output_dir, f".{name}-old-")
            os.replace(final, retired / name)
            os.replace(staging, final)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
