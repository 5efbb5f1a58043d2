"""A clip's sound for the frames it trains on: its first audio stream decoded with PyAV,
resampled to the model's rate and channel layout, and cut to exactly the trained frames' time
span (the first trained frame's presentation time, for as long as those frames are shown:
``ClipSpan``, which clip.py measures while it decodes them).

Pure PyAV + torch and deterministic. A clip without an audio stream has no sound (None); sound
that ends before the span does is padded with silence, and a stream that starts after the first
frame is preceded by it, so the samples always cover the span exactly."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import torch


@dataclass(frozen=True)
class AudioRequest:
    """What a model's audio encoder takes: samples per second and channels (1 or 2)."""

    sample_rate: int
    channels: int

    @property
    def layout(self) -> str:
        return {1: "mono", 2: "stereo"}[self.channels]


@dataclass(frozen=True)
class ClipSpan:
    """The trained frames' time span in the source, in seconds: the first frame's presentation
    time and how long the frames are shown (their count over the rate they train at)."""

    start: float
    duration: float


def span_samples(span: ClipSpan, rate: int) -> tuple[int, int]:
    """(first sample, sample count) of ``span`` at ``rate``, rounded to the nearest sample."""
    return round(span.start * rate), round(span.duration * rate)


def decode_audio(source: str | Path | bytes | BinaryIO, span: ClipSpan,
                 request: AudioRequest) -> torch.Tensor | None:
    """[channels, samples] float32 of ``source``'s first audio stream over ``span``, resampled
    to ``request``; None when the container has no audio stream."""
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    if isinstance(source, Path):
        source = str(source)
    with av.open(source, "r") as container:
        if not container.streams.audio:
            return None
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="fltp", layout=request.layout,
                                      rate=request.sample_rate)
        origin, pieces = None, []
        for frame in container.decode(stream):
            if origin is None:
                origin = float(frame.pts * frame.time_base) if frame.pts is not None else 0.0
            pieces += [part.to_ndarray() for part in resampler.resample(frame)]
        pieces += [part.to_ndarray() for part in resampler.resample(None)]
    decoded = (np.concatenate(pieces, axis=1) if pieces
               else np.zeros((request.channels, 0), np.float32))
    return _cut(torch.from_numpy(decoded.astype(np.float32)), origin or 0.0, span,
                request.sample_rate)


def _cut(samples: torch.Tensor, origin: float, span: ClipSpan, rate: int) -> torch.Tensor:
    """The samples of ``span`` from a stream whose first sample plays at ``origin`` seconds,
    silence where the stream has none."""
    first, count = span_samples(span, rate)
    offset = first - round(origin * rate)  # the span's first sample in the decoded stream
    out = samples.new_zeros(samples.shape[0], count)
    begin, end = max(offset, 0), min(offset + count, samples.shape[1])
    if end > begin:
        out[:, begin - offset:end - offset] = samples[:, begin:end]
    return out
