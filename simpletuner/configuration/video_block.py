"""``dataset_type: video``: SimpleTuner's ``video`` block and the settings later stages read.

SimpleTuner's meanings: ``num_frames`` is the frame count every clip trains at (its first
frames); clips shorter than it are skipped. ``min_frames`` / ``max_frames`` skip clips with
fewer / more frames (``min_frames`` defaults to ``num_frames``). ``bucket_strategy``
``aspect_ratio`` (its default) buckets by size only, every clip at ``num_frames``: unset, as
SimpleTuner, 5 seconds at config.json's ``framerate`` (or the family's, Wan 15: 75 frames);
``resolution_frames`` buckets by size and frame count: without ``num_frames`` each clip trains
at its own length, rounded down to a multiple of ``frame_interval`` (when set). Either way the
count is then snapped down to the family's VAE rule (its spec's frame_rule: Wan 4n+1), as
SimpleTuner trims to it; a clip left below ``min_frames`` is skipped.

``fps`` (SimpleTuner reads it only to print it): when set, every clip is re-timed to it before
its frame count is decided (clip_timing.py), so all of the above see the re-timed clip; unset,
clips train at the rate they were recorded at.

``missing_audio`` (ours): what a family that trains sound does with a clip that has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import (families_where, frame_rule, known_spec,
                                                video_families)
from simpletuner.configuration.fields import option, parse_fields
from simpletuner.dataset_kinds import kind_named
from simpletuner.families.frame_rule import FrameRule

BUCKET_STRATEGIES = ("aspect_ratio", "resolution_frames")


@dataclass
class VideoConfig:
    """The ``video`` block of a ``dataset_type: video`` dataset."""

    num_frames: int | None = option(
        None, minimum=1, help="frames every clip trains at (its first ones; snapped down to the "
        "family's rule, Wan 4n+1); shorter clips are skipped. Unset: each clip's own length "
        "(bucket_strategy 'resolution_frames'), or 5 s at config.json's framerate (the "
        "family's, Wan 15, when unset; bucket_strategy 'aspect_ratio'), as SimpleTuner")
    min_frames: int | None = option(
        None, minimum=1, help="clips with fewer frames are skipped; unset: num_frames (or 1)")
    max_frames: int | None = option(None, minimum=1, help="clips with more frames are skipped")
    frame_interval: int | None = option(
        None, minimum=1, help="bucket_strategy 'resolution_frames': a clip's frame count is "
        "rounded down to a multiple of this before the family's rule")
    is_i2v: bool = option(False, help="image-to-video: the first frame is the clean condition "
                          "(Wan 2.2 TI2V-5B trains so on this dataset; a Wan 2.1 image-to-video "
                          "folder does on every dataset)")
    bucket_strategy: Literal["aspect_ratio", "resolution_frames"] = option(
        "aspect_ratio", help="'aspect_ratio': by size, every clip at num_frames; "
        "'resolution_frames': by size and frame count (bucket 'WxH@F')")
    fps: int | None = option(
        None, minimum=1, help="re-time every clip to this frame rate (frames picked by their "
        "timestamps; Wan trains at 16) before its frame count is decided; unset: each clip "
        "at its own rate")
    missing_audio: Literal["video_only", "skip"] = option(
        "video_only", help="a family that trains sound (ltxvideo2): a clip without an audio "
        "stream trains video-only (its audio loss off; the cache step names them) or, 'skip', "
        "is left out as a failed sample")


@dataclass(frozen=True)
class VideoSettings:
    """A video dataset's frame settings with the defaults filled in and the family's rule."""

    rule: FrameRule
    num_frames: int | None
    min_frames: int
    max_frames: int | None
    frame_interval: int | None
    is_i2v: bool
    bucket_strategy: str
    fps: int | None = None  # the rate clips are re-timed to; None: their own

    @classmethod
    def for_dataset(cls, video: dict | None, model_family: str,
                    framerate: int | None = None) -> "VideoSettings":
        """From the checked block (``DatasetConfig.video``) of a dataset the loader accepted;
        ``framerate``: config.json's (SimpleTuner's name), for the default num_frames."""
        block = VideoConfig(**(video or {}))
        rule = frame_rule(model_family)
        frames = block.num_frames
        if frames is None and block.bucket_strategy == "aspect_ratio":
            frames = default_num_frames(rule, framerate)
        floor = block.min_frames or frames or 1
        return cls(rule=rule, num_frames=frames,
                   min_frames=max(floor, frames or 1), max_frames=block.max_frames,
                   frame_interval=block.frame_interval, is_i2v=block.is_i2v,
                   bucket_strategy=block.bucket_strategy, fps=block.fps)

    def key(self) -> dict[str, Any]:
        """What the index depends on (the metadata cache's settings)."""
        return {"frame_rule": self.rule.describe(), "num_frames": self.num_frames,
                "min_frames": self.min_frames, "max_frames": self.max_frames,
                "frame_interval": self.frame_interval, "bucket_strategy": self.bucket_strategy,
                # only when set, so an index cached without re-timing stays valid
                **({"fps": self.fps} if self.fps is not None else {})}


def default_num_frames(rule: FrameRule, framerate: int | None) -> int:
    """SimpleTuner's num_frames for a video dataset that sets none: 5 seconds at
    ``framerate`` (the family's when None), as the family's VAE encodes it."""
    return max(rule.snap_down(5 * (framerate or rule.fps)), rule.remainder)


def parse_video_block(raw: Any, where: Location, problems: list[Problem]) -> dict | None:
    """The accepted ``video`` block (absent: all defaults), or None after appending what is
    wrong with it, every problem at once."""
    where = where.within("video", "key 'video'")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(where.problem(
            "", f"expected an object such as {{\"num_frames\": 81}}, found {type(raw).__name__}"))
        return None
    before = len(problems)
    values = parse_fields(VideoConfig, raw, where, problems)
    if len(problems) == before:
        _check_combinations(VideoConfig(**values), where, problems)
    return values if len(problems) == before else None


def _check_combinations(block: VideoConfig, where: Location, problems: list[Problem]) -> None:
    low, high, frames = block.min_frames, block.max_frames, block.num_frames
    if low is not None and high is not None and low > high:
        problems.append(where.problem(
            "min_frames", f"'min_frames' ({low}) is larger than 'max_frames' ({high}), so every "
            "clip would be skipped"))
    if frames is not None and high is not None and frames > high:
        problems.append(where.problem(
            "num_frames", f"'num_frames' ({frames}) is larger than 'max_frames' ({high}): a clip "
            "long enough to train is skipped as too long"))
    if block.frame_interval is not None and (block.bucket_strategy != "resolution_frames"
                                             or frames is not None):
        problems.append(where.problem(
            "frame_interval", "'frame_interval' rounds the frame counts of bucket_strategy "
            "'resolution_frames' without 'num_frames'; here every clip trains at num_frames, so "
            "remove it"))


def check_video_dataset(dataset_type: str, given: Any, parsed: dict | None,
                        model_family: str | None, where: Location,
                        problems: list[Problem]) -> None:
    """A ``video`` block (``given``; ``parsed`` when accepted) only on a video dataset, a video
    dataset only for a family that trains on clips, and a ``num_frames`` that family's VAE
    encodes (``model_family`` None: config.json is not known yet)."""
    if not kind_named(dataset_type).has_clips:
        if given is not None:
            problems.append(where.problem(
                "video", "key 'video' is read for 'dataset_type': 'video' only; this dataset is "
                f"'{dataset_type}'. Remove it, or set dataset_type"))
        return
    if model_family is None:
        return
    rule = frame_rule(model_family)
    if rule is None:
        problems.append(where.problem(
            "dataset_type", "'dataset_type': 'video' needs a model family that trains on clips "
            f"({', '.join(video_families())}); model_family '{model_family}' trains on images. "
            "Convert the clips to images or change model_family"))
        return
    _check_sound_key(parsed, given, model_family, where, problems)
    # the given value too when the block was refused for another key: every problem at once
    frames = parsed.get("num_frames") if parsed is not None else (
        given.get("num_frames") if isinstance(given, dict) else None)
    if (isinstance(frames, int) and not isinstance(frames, bool) and frames >= 1
            and (refusal := rule.refusal(model_family, frames))):
        problems.append(where.problem(
            "video.num_frames", f"key 'video': 'num_frames' ({frames}) {refusal}"))


def _check_sound_key(parsed: dict | None, given: Any, model_family: str, where: Location,
                     problems: list[Problem]) -> None:
    """``missing_audio`` only for a family that trains sound: elsewhere it would change
    nothing."""
    block = parsed if parsed is not None else (given if isinstance(given, dict) else {})
    spec = known_spec(model_family)
    if "missing_audio" in block and spec is not None and not spec.trains_sound:
        sounding = ", ".join(families_where(lambda spec: spec.trains_sound))
        problems.append(where.problem(
            "video.missing_audio", f"key 'video': 'missing_audio' applies to the families that "
            f"train sound ({sounding}); model_family '{model_family}' trains clips without it. "
            "Remove it"))
