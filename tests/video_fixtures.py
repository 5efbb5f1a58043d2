"""Real clips written with PyAV for the video tests: coloured shapes moving over a gradient, of a
given size, fps and frame count, plus the bad files discovery must skip (truncated, zero-length,
audio-only, not a video). Shared by the discovery, bucket and video training tests."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# codec per container: what this FFmpeg build writes and every PyAV build reads back
CODECS = {".mp4": "libx264", ".mkv": "libx264", ".webm": "libvpx-vp9", ".avi": "mpeg4",
          ".mov": "libx264"}


def shapes_frame(width: int, height: int, index: int, seed: int = 0) -> np.ndarray:
    """Frame ``index`` (H x W x 3 uint8): a square and a bar that move a step per frame."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(40, 255, size=(3, 3))
    ys, xs = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), np.uint8)
    frame[..., 0] = (xs * 255 // max(width - 1, 1)).astype(np.uint8)
    frame[..., 1] = (ys * 255 // max(height - 1, 1)).astype(np.uint8)
    frame[..., 2] = colours[0, 2]
    side = max(2, min(width, height) // 3)
    x = (index * max(1, width // 16)) % max(1, width - side)
    y = (index * max(1, height // 24) + height // 4) % max(1, height - side)
    frame[y:y + side, x:x + side] = colours[1]
    bar = (height - 1 - index * 2) % height
    frame[bar:bar + max(1, height // 10), :] = colours[2]
    return frame


def write_clip(path: Path, width: int, height: int, frames: int, fps: int | Fraction = 16,
               seed: int = 0, rotation: int = 0, caption: str | None = "moving shapes", *,
               frame_ms: list[int] | None = None, faststart: bool = False) -> Path:
    """A clip of exactly ``frames`` frames at ``fps``; ``rotation`` (degrees, counter-clockwise)
    goes in the container's display matrix, as phones write it. ``frame_ms``: each frame's
    duration in milliseconds instead (a variable frame rate, as phones record). ``faststart``:
    an MP4's index before its data, as streaming sites serve them. ``caption``: a .txt beside
    it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream(CODECS[path.suffix.lower()], rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if frame_ms is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        if rotation:
            stream.set_display_rotation(rotation)
        at = 0
        for index in range(frames):
            image = av.VideoFrame.from_ndarray(shapes_frame(width, height, index, seed),
                                               format="rgb24")
            if frame_ms is not None:
                image.pts, image.time_base = at, Fraction(1, 1000)
                at += frame_ms[index % len(frame_ms)]
            container.mux(stream.encode(image))
        container.mux(stream.encode())
    return _captioned(path, caption)


def write_noisy_clip(path: Path, frames: int, width: int = 160, height: int = 120,
                     caption: str | None = "noise") -> Path:
    """A clip of random pixels: large for its length (about 10 KB a frame at 160x120), for
    checking how much of a file a probe reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(frames)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(CODECS[path.suffix.lower()], rate=16)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"g": "16"}  # a keyframe a second, as cameras write them
        for _ in range(frames):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return _captioned(path, caption)


def write_audio_only(path: Path, seconds: float = 1.0, caption: str | None = "a tone") -> Path:
    """A file with a video name and one AAC audio stream, no video stream."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = 16000
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=rate)
        samples = np.sin(np.arange(int(rate * seconds)) * 0.05).astype(np.float32)
        for start in range(0, len(samples), 1024):
            chunk = samples[start:start + 1024]
            frame = av.AudioFrame.from_ndarray(chunk[None, :], format="flt", layout="mono")
            frame.sample_rate = rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return _captioned(path, caption)


def write_truncated(path: Path, keep: float = 0.5, caption: str | None = "cut short") -> Path:
    """A real clip cut to ``keep`` of its bytes, as an interrupted copy leaves it (an MP4's
    index is written last, so it is lost)."""
    write_clip(path, 64, 48, 17, caption=caption)
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])
    return path


def write_zero_length(path: Path, caption: str | None = "empty") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return _captioned(path, caption)


def write_not_a_video(path: Path, caption: str | None = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is a text file with a video name\n" * 40)
    return _captioned(path, caption)


def _captioned(path: Path, caption: str | None) -> Path:
    """``path``, with ``caption`` written beside it as <name>.txt unless None."""
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)
    return path


def decoded_frame_count(path: Path) -> int:
    """Frames of the first video stream, counted by decoding every one."""
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def write_clip_with_sound(path: Path, width: int, height: int, frames: int, fps: int = 24, *,
                          seed: int = 0, sample_rate: int = 44100, seconds: float | None = None,
                          caption: str | None = "moving shapes with a tone") -> Path:
    """write_clip's picture with an AAC stereo track beside it: a 440 Hz tone whose loudness
    rises linearly over ``seconds`` (default: the picture's duration), so each instant of it
    sounds different."""
    path.parent.mkdir(parents=True, exist_ok=True)
    seconds = frames / fps if seconds is None else seconds
    with av.open(str(path), "w") as container:
        video = container.add_stream(CODECS[path.suffix.lower()], rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        audio = container.add_stream("aac", rate=sample_rate, layout="stereo")
        for index in range(frames):
            image = av.VideoFrame.from_ndarray(shapes_frame(width, height, index, seed),
                                               format="rgb24")
            container.mux(video.encode(image))
        container.mux(video.encode())
        times = np.arange(round(seconds * sample_rate)) / sample_rate
        tone = (0.8 * times / seconds * np.sin(2 * np.pi * 440 * times)).astype(np.float32)
        for start in range(0, len(tone), 1024):
            piece = np.stack([tone[start:start + 1024]] * 2)
            frame = av.AudioFrame.from_ndarray(piece, format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = sample_rate, start
            container.mux(audio.encode(frame))
        container.mux(audio.encode())
    return _captioned(path, caption)
