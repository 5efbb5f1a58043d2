"""Pure frame math of video datasets: the frame count a clip trains at, its bucket "WxH@F", and
what caching decodes of it (ClipPlan). The meanings are SimpleTuner's (video_block.py); with
``video.fps`` set a clip's frame count is its re-timed one (clip_timing.py) before any of them.

A clip's bucket key is its size bucket with ``@<frames>`` (SimpleTuner's resolution_frames
format); image buckets keep "WxH". So every existing image index, its cache and its digest are
unchanged, and since the sampler groups by (dataset, bucket key), an optimizer step never mixes
frame counts, as it never mixes sizes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simpletuner.configuration.video_block import VideoSettings
from simpletuner.helpers.metadata.clip_timing import (describe_rate, needs_retiming,
                                                      retimed_frames, retiming_note)
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex, SkippedFile

FRAMES_SEPARATOR = "@"


def training_frames(clip_frames: int, video: VideoSettings,
                    counted: str | None = None) -> tuple[int, str | None]:
    """(frames the clip trains at, None), or (0, why it is skipped). A fixed text per setting
    and count, so reports can count skips by reason; ``counted`` says how a re-timed clip's
    ``clip_frames`` came about."""
    counted = counted or f"{clip_frames} frames"
    if video.num_frames is not None and clip_frames < video.num_frames:
        return 0, f"too short: {counted}, below num_frames {video.num_frames}"
    if clip_frames < video.min_frames:
        return 0, f"too short: {counted}, below min_frames {video.min_frames}"
    if video.max_frames is not None and clip_frames > video.max_frames:
        return 0, f"too long: {counted}, above max_frames {video.max_frames}"
    usable = video.num_frames if video.num_frames is not None else clip_frames
    if video.frame_interval is not None:
        usable -= usable % video.frame_interval
    frames = video.rule.snap_down(usable)
    if frames < (1 if video.num_frames is not None else video.min_frames):
        return 0, (f"too short: {counted} train as {frames} (frame_interval, then "
                   f"the {video.rule.describe()} frame rule), below min_frames {video.min_frames}")
    return frames, None


def timed_frames(source_frames: int, source_rate: str, video: VideoSettings) -> tuple[int, str]:
    """(the clip's frame count at the rate it trains at, how the skip reasons name it)."""
    if not needs_retiming(source_rate, video.fps):
        return source_frames, f"{source_frames} frames"
    count = retimed_frames(source_frames, source_rate, video.fps)
    return count, (f"{source_frames} frames at {describe_rate(source_rate)} fps, {count} at "
                   f"{video.fps} fps")


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
                video: VideoSettings, skipped: list[SkippedFile],
                clip_rates: list[str] | None = None) -> list[str | None]:
    """Each clip's bucket: its size bucket (None: already refused) with its training frames
    (re-timed first when ``video.fps`` is set: ``clip_rates`` are the clips' source rates); a
    clip its frames refuse is None here and added to ``skipped``."""
    keys: list[str | None] = []
    rates = clip_rates if clip_rates is not None else [None] * len(sample_ids)
    for size_key, sample_id, count, rate in zip(size_keys, sample_ids, clip_frames, rates):
        if size_key is None:
            keys.append(None)
            continue
        counted = None
        if video.fps is not None:
            count, counted = timed_frames(count, rate, video)
        frames, reason = training_frames(count, video, counted)
        if reason is not None:
            skipped.append(SkippedFile(sample_id, reason))
        keys.append(None if reason is not None else clip_key(size_key, frames))
    return keys


def clip_plans(buckets: Mapping[str, Sequence[str]], files: FileTable,
               target_fps: int | None = None) -> dict[str, ClipPlan]:
    """Each bucketed clip's ClipPlan, from its bucket's frames and what discovery read;
    ``target_fps``: video.fps, kept on the plans of clips recorded at another rate."""
    plans = {}
    for key, ids in buckets.items():
        frames = bucket_frames(key)
        for sample_id in ids:
            row = files.row_of(sample_id)
            rate = files.clips["fps"][row]
            plans[sample_id] = ClipPlan(frames, rate, files.clips["frames"][row],
                                        files.clips["counted_by"][row],
                                        target_fps if needs_retiming(rate, target_fps) else None)
    return plans


def retiming_summary(index: DatasetIndex) -> str | None:
    """The log line naming the index's re-timed clips and their source rates; None if none."""
    retimed = {s: plan.fps for s, plan in index.clips.items() if plan.retimed_fps}
    if not retimed:
        return None
    target = next(plan.retimed_fps for plan in index.clips.values() if plan.retimed_fps)
    return retiming_note(index.dataset_id, target, retimed)
