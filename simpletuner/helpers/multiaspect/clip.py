"""Decode a clip for training and fit it to its bucket "WxH@F": its first F frames of the first
video stream, in presentation order, at the source's rate or re-timed to ``video.fps`` (frames
picked by their timestamps on the probe's 1/R grid, clip_timing.py), each frame rotated as the
container says it is displayed, then resized and cropped exactly as an image of that size would
be (image.py), with one crop for every frame.

Pure PyAV + Pillow + torch and deterministic: a random crop comes from the sample's own RNG
(``crop_rng``), drawn afresh for each frame so all frames share it. A clip that decodes to
fewer frames than its bucket needs raises ``ShortClipError``, which the latent cache reports
as that clip's skip reason. A model that trains sound gets the clip's audio over exactly the
decoded frames' time span (clip_audio.py)."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import av
import torch
from PIL import Image

from simpletuner.helpers.metadata.backends.clip_probe import stream_rate
from simpletuner.helpers.metadata.clip_timing import source_slot
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest, ClipSpan, decode_audio
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
    span: ClipSpan | None = None       # the frames' time span in the source
    # [channels, samples] over ``span`` when asked for (None: not asked, or no audio stream)
    audio: torch.Tensor | None = None


def decode_frames(source: str | Path | bytes | BinaryIO, frames: int,
                  fps: int | None = None) -> list[Image.Image]:
    """The first ``frames`` frames of the first video stream as displayed RGB images, re-timed
    to ``fps`` when given. Raises ShortClipError when the stream ends before, PyAV's error when
    it cannot be decoded."""
    return decode_trained_frames(source, frames, fps)[0]


def decode_trained_frames(source: str | Path | bytes | BinaryIO, frames: int,
                          fps: int | None = None) -> tuple[list[Image.Image], ClipSpan]:
    """decode_frames' images and their time span in the source: from the first frame's
    presentation time, ``frames`` over the rate they train at (``fps``, else the stream's)."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    if isinstance(source, Path):
        source = str(source)
    with av.open(source, "r") as container:
        if not container.streams.video:
            raise ShortClipError("no video stream")
        rate = stream_rate(container.streams.video[0])
        start: list[float] = []
        decoded = _noting_start(container.decode(video=0), start)
        shown = (_displayed(frame) for frame in decoded) if fps is None else _retimed(
            decoded, rate, fps)
        pictures = list(itertools.islice(shown, frames))
    if len(pictures) == frames:
        return pictures, ClipSpan(start[0], float(frames / Fraction(fps or rate)))
    timing = f" re-timed to {fps} fps" if fps is not None else ""
    raise ShortClipError(f"decoded {len(pictures)} frames{timing}, its bucket trains at {frames}; "
                         "the container's frame count was wrong (re-encode the clip)")


def _noting_start(decoded: Iterator[av.VideoFrame], start: list[float]
                  ) -> Iterator[av.VideoFrame]:
    """``decoded`` unchanged; the first frame's presentation time (seconds) goes in ``start``."""
    for frame in decoded:
        if not start:
            start.append(float(frame.pts * frame.time_base) if frame.pts is not None else 0.0)
        yield frame


def _displayed(frame: av.VideoFrame) -> Image.Image:
    image = frame.to_image()  # RGB24
    rotation = (frame.rotation or 0) % 360  # degrees counter-clockwise, as displayed
    return image.rotate(rotation, expand=True) if rotation else image


def _retimed(decoded: Iterator[av.VideoFrame], rate: Fraction, fps: int) -> Iterator[Image.Image]:
    """Re-timed frame k: the last source frame whose slot is at most floor(k*R/T). A frame's
    slot is its timestamp from the first frame's on the 1/R grid, rounded, so a container's
    rounded timestamps pick the frames the count assumed; the last frame lasts one slot. Each
    picked frame is converted once, a dropped one never."""
    current, image, slot, origin, picked = None, None, 0, None, 0
    for position, frame in enumerate(decoded):
        if frame.pts is None:
            slot = position
        else:
            origin = frame.pts if origin is None else origin
            slot = round((frame.pts - origin) * Fraction(frame.time_base) * rate)
        while current is not None and source_slot(picked, rate, fps) < slot:
            image = _displayed(current) if image is None else image
            yield image
            picked += 1
        current, image = frame, None
    while current is not None and source_slot(picked, rate, fps) <= slot:
        image = _displayed(current) if image is None else image
        yield image
        picked += 1


def prepare_clip(source: str | Path | bytes | BinaryIO, target: tuple[int, int], frames: int,
                 *, crop: bool, crop_style: CropStyle = "center", seed: int = 0,
                 dataset_id: str = "", sample_id: str = "",
                 downsample: Downsample | None = None, fps: int | None = None,
                 audio: AudioRequest | None = None) -> PreparedClip:
    """Decode ``frames`` frames of ``source`` (re-timed to ``fps`` when given) and fit each to
    ``target`` (w, h); random crops are keyed by (seed, dataset_id, sample_id), the same for
    every frame. ``audio``: also its sound over those frames' span (clip_audio.py)."""
    fitted = []
    images, span = decode_trained_frames(source, frames, fps)
    sound = decode_audio(source, span, audio) if audio is not None else None
    for image in images:
        rng = crop_rng(seed, dataset_id, sample_id) if crop and crop_style == "random" else None
        fitted.append(fit_to_target(image, target, crop=crop, crop_style=crop_style, rng=rng,
                                    downsample=downsample))
    first = fitted[0]
    return PreparedClip(pixels=torch.stack([f.pixels for f in fitted], dim=1),
                        original_size=first.original_size, crop_top_left=first.crop_top_left,
                        target_size=first.target_size, span=span, audio=sound)
