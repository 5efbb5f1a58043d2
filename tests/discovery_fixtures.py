"""Generated image folders for discovery and plan tests (shared by test_discovery, test_plan_cli)."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image

from simpletuner.configuration import DatasetConfig, TrainingConfig

ORIENTATION = 0x0112


def image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    base = Image.effect_noise((width, height), 40 + seed % 50).convert("RGB")
    return base.convert(mode) if mode != "RGB" else base


def encode(img: Image.Image, fmt: str, **save_args) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **save_args)
    return buffer.getvalue()


def write(folder: Path, name: str, data: bytes, caption: str | None = "a caption") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)
    return path


def rotated_jpeg(stored_width: int, stored_height: int, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return encode(image(stored_width, stored_height), "JPEG", exif=exif)


def training_config(output_dir: Path, **overrides) -> TrainingConfig:
    values = dict(model_family="sd1x", pretrained_model_name_or_path="builtin:tiny-sd1x",
                  output_dir=str(output_dir), data_backend_config="unused.json",
                  resolution=64, aspect_bucket_alignment=16)
    values.update(overrides)
    return TrainingConfig(**values)


def dataset_config(folder: Path, **overrides) -> DatasetConfig:
    values = dict(id="photos", instance_data_dir=str(folder))
    values.update(overrides)
    return DatasetConfig(**values)


def touch_later(path: Path) -> None:
    """Move a file's mtime forward so a rewrite is seen as a change even within one clock tick."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))
