"""Validation clips of a model that makes sound (LTX-2): clip-NN.mp4, H.264 video at the
validation frame rate with its AAC audio track, written with PyAV, atomically. The sound is cut
(or padded with silence) to the frames' duration, so picture and sound end together."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image

from simpletuner.common.atomic import atomic_write_with

AAC_FRAME = 1024  # samples per AAC frame


def fitted_sound(sound: np.ndarray, frames: int, framerate: int, sample_rate: int
                 ) -> np.ndarray:
    """[channels, samples] float32, exactly ``frames / framerate`` seconds long."""
    count = round(frames * sample_rate / framerate)
    out = np.zeros((sound.shape[0], count), np.float32)
    kept = min(count, sound.shape[1])
    out[:, :kept] = np.clip(sound[:, :kept], -1.0, 1.0)
    return out


def write_mp4(frames: list[Image.Image], sound: np.ndarray, path: Path, framerate: int,
              sample_rate: int) -> None:
    """``frames`` (even sides: H.264's 4:2:0) at ``framerate`` with ``sound`` [channels,
    samples] at ``sample_rate`` as AAC, mono or stereo."""
    sound = fitted_sound(sound, len(frames), framerate, sample_rate)
    layout = {1: "mono", 2: "stereo"}[sound.shape[0]]

    def write(temporary: str) -> None:
        with av.open(temporary, "w", format="mp4") as container:
            video = container.add_stream("libx264", rate=framerate)
            video.width, video.height = frames[0].size
            video.pix_fmt = "yuv420p"
            audio = container.add_stream("aac", rate=sample_rate, layout=layout)
            for image in frames:
                container.mux(video.encode(av.VideoFrame.from_image(image.convert("RGB"))))
            container.mux(video.encode())
            for start in range(0, sound.shape[1], AAC_FRAME):
                piece = av.AudioFrame.from_ndarray(
                    np.ascontiguousarray(sound[:, start:start + AAC_FRAME]), format="fltp",
                    layout=layout)
                piece.sample_rate, piece.pts = sample_rate, start
                container.mux(audio.encode(piece))
            container.mux(audio.encode())

    atomic_write_with(path, write)


def save_validation_mp4s(clips: list[list[Image.Image]], sounds: list[np.ndarray],
                         folder: Path, framerate: int, sample_rate: int) -> list[Path]:
    """clip-00.mp4, clip-01.mp4, ... in ``folder``: each clip with its sound."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (frames, sound) in enumerate(zip(clips, sounds)):
        paths.append(folder / f"clip-{index:02d}.mp4")
        write_mp4(frames, sound, paths[-1], framerate, sample_rate)
    return paths
