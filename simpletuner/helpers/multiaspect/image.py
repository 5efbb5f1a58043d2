"""Decode an image and fit it to its bucket: pixels in [-1, 1] plus the geometry SDXL needs.

Pure Pillow + torch. The only randomness (``crop_style: random``) comes from an RNG seeded by a
stable digest of (seed, dataset id, sample id), so a sample always gets the same crop, on every
rank and every run, and the global RNGs are never touched.
"""

from __future__ import annotations

import hashlib
import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import torch
from PIL import Image, ImageOps

from simpletuner.common.names import name_bytes

CropStyle = Literal["center", "random", "corner"]


@dataclass(frozen=True)
class PreparedImage:
    """Sizes are (height, width); ``crop_top_left`` is in the resized image (SDXL convention)."""

    pixels: torch.Tensor               # [3, H, W] float32 in [-1, 1]
    original_size: tuple[int, int]
    crop_top_left: tuple[int, int]
    target_size: tuple[int, int]


def load_rgb(source: str | Path | bytes | BinaryIO) -> Image.Image:
    """Fully decode ``source`` (path, bytes or file object), apply the EXIF orientation and
    return an 8-bit RGB image. Transparent pixels are composited on white. Raises the decoder's
    error for unreadable or truncated files; the caller decides how to report it."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    with Image.open(source) as opened:
        opened.load()  # decode now, so truncated data fails here and not later
        image = ImageOps.exif_transpose(opened)
        return _to_rgb(image)


def _to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        # High bit depth grayscale: Pillow's own conversion clips at 255 (near-white images).
        values = np.asarray(image, dtype=np.float64)
        scale = 255.0 / 65535.0 if mode != "F" else 1.0
        if mode == "F" and values.size and float(values.max()) <= 1.0:
            scale = 255.0  # float images are usually in [0, 1]
        gray = np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)
        return Image.fromarray(gray, mode="L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode == "RGB":
        return image.copy()  # detach from the file object being closed
    return image.convert("RGB")


@dataclass(frozen=True)
class Downsample:
    """SimpleTuner's maximum_image_size with target_downsample_size, in the dataset's resolution
    units: a cropped image above the maximum is first scaled to the target size (keeping its
    aspect), then cropped, so the crop keeps more of the scene than a crop of the original."""

    resolution_type: str   # pixel: short edge; area: megapixels; pixel_area: a square's edge
    maximum: float
    target: float

    def scale(self, width: int, height: int) -> float | None:
        """The factor that brings an image above the maximum to the target size, else None."""
        if self.resolution_type == "pixel":
            size, power = float(min(width, height)), 1.0
        elif self.resolution_type == "area":
            size, power = width * height / 1_000_000, 0.5
        else:
            size, power = (width * height) ** 0.5, 1.0
        return (self.target / size) ** power if size > self.maximum else None


def crop_rng(seed: int, dataset_id: str, sample_id: str) -> random.Random:
    """A private RNG for one sample's random crop; never Python's salted ``hash()``."""
    payload = name_bytes(f"{seed}\x00{dataset_id}\x00{sample_id}")
    return random.Random(int.from_bytes(hashlib.sha256(payload).digest()[:8], "big"))


def crop_box(original: tuple[int, int], target: tuple[int, int], style: CropStyle,
             rng: random.Random | None = None, minimum_scale: float | None = None
             ) -> tuple[tuple[int, int], tuple[int, int]]:
    """Where to cut ``target`` (w, h) out of ``original`` (w, h) scaled to cover it, and by at
    least ``minimum_scale`` (Downsample.scale) when given.

    Returns (resized (w, h), crop (left, top)): the crop box lies inside the resized image."""
    ow, oh = original
    tw, th = target
    scale = max(tw / ow, th / oh, minimum_scale or 0.0)
    # Rounding may undershoot by one pixel; the resized image must still cover the target.
    rw, rh = max(tw, round(ow * scale)), max(th, round(oh * scale))
    if style == "center":
        left, top = (rw - tw) // 2, (rh - th) // 2
    elif style == "corner":  # SimpleTuner's corner crop keeps the bottom-right part
        left, top = rw - tw, rh - th
    elif style == "random":
        if rng is None:
            raise ValueError("crop_style 'random' needs the sample's rng (see crop_rng)")
        left, top = rng.randint(0, rw - tw), rng.randint(0, rh - th)
    else:
        raise ValueError(f"unknown crop_style {style!r}; expected 'center', 'random' or 'corner'")
    return (rw, rh), (left, top)


def fit_to_target(image: Image.Image, target: tuple[int, int], *, crop: bool,
                  crop_style: CropStyle = "center", rng: random.Random | None = None,
                  downsample: Downsample | None = None) -> PreparedImage:
    """Resize ``image`` to ``target`` (w, h). Without crop it is resized directly (the bucket
    already matches its aspect up to alignment rounding); with crop it is scaled to cover the
    target (or to ``downsample``'s size when larger) and cut at the chosen offset."""
    ow, oh = image.size
    tw, th = target
    if not crop:
        fitted = image.resize((tw, th), Image.Resampling.LANCZOS, reducing_gap=3.0)
        left = top = 0
    else:
        minimum = downsample.scale(ow, oh) if downsample is not None else None
        (rw, rh), (left, top) = crop_box((ow, oh), (tw, th), crop_style, rng, minimum)
        # Resample only the crop's source region: same result as resize-then-crop, less work.
        sx, sy = ow / rw, oh / rh
        box = (left * sx, top * sy, (left + tw) * sx, (top + th) * sy)
        fitted = image.resize((tw, th), Image.Resampling.LANCZOS, box=box, reducing_gap=3.0)
    return PreparedImage(
        pixels=to_tensor(fitted),
        original_size=(oh, ow),
        crop_top_left=(top, left),
        target_size=(th, tw),
    )


def to_tensor(image: Image.Image) -> torch.Tensor:
    """8-bit RGB image -> [3, H, W] float32 in [-1, 1]."""
    array = np.asarray(image, dtype=np.uint8)
    pixels = torch.from_numpy(array.copy()).permute(2, 0, 1).float()
    return pixels.div_(127.5).sub_(1.0)


def to_image(pixels: torch.Tensor) -> Image.Image:
    """The inverse of to_tensor: [3, H, W] in [-1, 1] -> the 8-bit RGB image."""
    array = ((pixels.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    return Image.fromarray(array.permute(1, 2, 0).numpy())


def prepare_image(source: str | Path | bytes | BinaryIO, target: tuple[int, int], *,
                  crop: bool, crop_style: CropStyle = "center", seed: int = 0,
                  dataset_id: str = "", sample_id: str = "",
                  downsample: Downsample | None = None,
                  resize_first: tuple[int, int] | None = None) -> PreparedImage:
    """Load ``source`` and fit it to ``target`` (w, h); random crops are keyed by
    (seed, dataset_id, sample_id). ``resize_first`` (w, h): an edit reference is first resized
    to its target's size, so the same crop cuts the same region of both."""
    image = load_rgb(source)
    if resize_first is not None and image.size != tuple(resize_first):
        image = image.resize(tuple(resize_first), Image.Resampling.LANCZOS, reducing_gap=3.0)
    rng = crop_rng(seed, dataset_id, sample_id) if crop and crop_style == "random" else None
    return fit_to_target(image, target, crop=crop, crop_style=crop_style, rng=rng,
                         downsample=downsample)
