"""The frame counts a video family's VAE accepts; a video family's spec holds its rule.

A video VAE compresses time by a factor ``multiple`` and keeps the first frame on its own, so a
clip it encodes has ``multiple * n + remainder`` frames (Wan: 4n+1, so 1, 5, 9, ..., 81).
Torch-free: ``check`` and ``plan`` read it as the loader does. A family without a rule trains on
images only, and a ``dataset_type: video`` dataset is refused for it before anything loads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrameRule:
    multiple: int   # the VAE's temporal compression
    remainder: int  # frames encoded on their own (the first one)
    # SimpleTuner's ``framerate`` for the family when config.json sets none (Wan: 15): a video
    # dataset without num_frames trains 5 s at it (video_block.py)
    fps: int = 30

    def describe(self) -> str:
        return f"{self.multiple}n+{self.remainder}"

    def accepts(self, frames: int) -> bool:
        return frames >= self.remainder and (frames - self.remainder) % self.multiple == 0

    def snap_down(self, frames: int) -> int:
        """The largest accepted count not above ``frames``; 0 when there is none."""
        if frames < self.remainder:
            return 0
        return frames - (frames - self.remainder) % self.multiple

    def refusal(self, family: str, frames: int) -> str | None:
        """Why ``family``'s VAE cannot encode ``frames`` frames, with the nearest counts that it
        can, for an error message; None when it can."""
        if self.accepts(frames):
            return None
        lower, higher = self.snap_down(frames), self.snap_down(frames + self.multiple)
        nearest = f"{lower} or {higher}" if lower else str(higher)
        return (f"is not a count {family}'s VAE encodes ({self.describe()} frames); use "
                f"{nearest}")
