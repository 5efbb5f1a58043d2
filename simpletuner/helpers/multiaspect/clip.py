"""Decode a clip for training and fit it to its bucket "WxH@F": its first F frames of the first
video stream, in presentation order, at the source's rate (never re-timed), each frame rotated
as the container says it is displayed, then resized and cropped exactly as an image of that
size would be (image.py), with one crop for every frame.

Pure PyAV + Pillow + torch and deterministic: a random crop comes from the sample's own RNG
(``crop_rng``), drawn afresh for each frame so all frames share it. A clip that decodes to
fewer frames than its bucket needs raises ``ShortClipError``, which the latent cache reports
as that clip's skip reason."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import torch
from PIL import Image

from simpletuner.helpers.multiaspect.image import (CropStyle, Downsample, crop_rng,
                                                   fit_to_target)


class ShortClipError(ValueError):
    """The decode found fewer frames than the clip's bucket trains at."""


@dataclass(frozen=True)
class PreparedClip:
    """Sizes are (height, width) of one frame, as PreparedImage's."""

    pixels: torch.Tensor               # [3, F, H, W] float32 in [-1, 1]
    original_size: tuple[int, int]
    crop_top_left: tuple[int, int]
    target_size: tuple[int, int]


def decode_frames(source: str | Path | bytes | BinaryIO, frames: int) -> list[Image.Image]:
    """The first ``frames`` frames of the first video stream as displayed RGB images. Raises
    ShortClipError when the stream ends before, PyAV's error when it cannot be decoded."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    if isinstance(source, Path):
        source = str(source)
    decoded: list[Image.Image] = []
    with av.open(source, "r") as container:
        if not container.streams.video:
            raise ShortClipError("no video stream")
        for frame in container.decode(video=0):
            image = frame.to_image()  # RGB24
            rotation = (frame.rotation or 0) % 360  # degrees counter-clockwise, as displayed
            decoded.append(image.rotate(rotation, expand=True) if rotation else image)
            if len(decoded) == frames:
                return decoded
    raise ShortClipError(f"decoded {len(decoded)} frames, its bucket trains at {frames}; "
                         "the container's frame count was wrong (re-encode the clip)")


def prepare_clip(source: str | Path | bytes | BinaryIO, target: tuple[int, int], frames: int,
                 *, crop: bool, crop_style: CropStyle = "center", seed: int = 0,
                 dataset_id: str = "", sample_id: str = "",
                 downsample: Downsample | None = None) -> PreparedClip:
    """Decode ``frames`` frames of ``source`` and fit each to ``target`` (w, h); random crops
    are keyed by (seed, dataset_id, sample_id), the same for every frame."""
    fitted = []
    for image in decode_frames(source, frames):
        rng = crop_rng(seed, dataset_id, sample_id) if crop and crop_style == "random" else None
        fitted.append(fit_to_target(image, target, crop=crop, crop_style=crop_style, rng=rng,
                                    downsample=downsample))
    first = fitted[0]
    return PreparedClip(pixels=torch.stack([f.pixels for f in fitted], dim=1),
                        original_size=first.original_size, crop_top_left=first.crop_top_left,
                        target_size=first.target_size)
