"""Pure frame math of video datasets: the frame count a clip trains at, its bucket "WxH@F", and
what caching decodes of it (ClipPlan). The meanings are SimpleTuner's (video_block.py).

A clip's bucket key is its size bucket with ``@<frames>`` (SimpleTuner's resolution_frames
format); image buckets keep "WxH". So every existing image index, its cache and its digest are
unchanged, and since the sampler groups by (dataset, bucket key), an optimizer step never mixes
frame counts, as it never mixes sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simpletuner.configuration.video_block import VideoSettings
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import ClipPlan, SkippedFile

FRAMES_SEPARATOR = "@"


def training_frames(clip_frames: int, video: VideoSettings) -> tuple[int, str | None]:
    """(frames the clip trains at, None), or (0, why it is skipped). A fixed text per setting
    and count, so reports can count skips by reason."""
    if video.num_frames is not None and clip_frames < video.num_frames:
        return 0, f"too short: {clip_frames} frames, below num_frames {video.num_frames}"
    if clip_frames < video.min_frames:
        return 0, f"too short: {clip_frames} frames, below min_frames {video.min_frames}"
    if video.max_frames is not None and clip_frames > video.max_frames:
        return 0, f"too long: {clip_frames} frames, above max_frames {video.max_frames}"
    usable = video.num_frames if video.num_frames is not None else clip_frames
    if video.frame_interval is not None:
        usable -= usable % video.frame_interval
    frames = video.rule.snap_down(usable)
    if frames < (1 if video.num_frames is not None else video.min_frames):
        return 0, (f"too short: {clip_frames} frames train as {frames} (frame_interval, then "
                   f"the {video.rule.describe()} frame rule), below min_frames {video.min_frames}")
    return frames, None


def clip_key(size_key: str, frames: int) -> str:
    return f"{size_key}{FRAMES_SEPARATOR}{frames}"


def bucket_frames(key: str) -> int:
    """The frames of bucket ``key``: F for a clip bucket "WxH@F", 1 for an image bucket "WxH"."""
    _, separator, frames = key.partition(FRAMES_SEPARATOR)
    if not separator:
        return 1
    if not frames.isdigit() or int(frames) < 1:
        raise ValueError(f"not a bucket key 'WxH@F': {key!r}")
    return int(frames)


def with_frames(size_keys: list[str | None], sample_ids: list[str], clip_frames: list[int],
                video: VideoSettings, skipped: list[SkippedFile]) -> list[str | None]:
    """Each clip's bucket: its size bucket (None: already refused) with its training frames;
    a clip its frames refuse is None here and added to ``skipped``."""
    keys: list[str | None] = []
    for size_key, sample_id, count in zip(size_keys, sample_ids, clip_frames):
        if size_key is None:
            keys.append(None)
            continue
        frames, reason = training_frames(count, video)
        if reason is not None:
            skipped.append(SkippedFile(sample_id, reason))
        keys.append(None if reason is not None else clip_key(size_key, frames))
    return keys


def clip_plans(buckets: Mapping[str, Sequence[str]], files: FileTable) -> dict[str, ClipPlan]:
    """Each bucketed clip's ClipPlan, from its bucket's frames and what discovery read."""
    plans = {}
    for key, ids in buckets.items():
        frames = bucket_frames(key)
        for sample_id in ids:
            row = files.row_of(sample_id)
            plans[sample_id] = ClipPlan(frames, files.clips["fps"][row],
                                        files.clips["frames"][row], files.clips["counted_by"][row])
    return plans
