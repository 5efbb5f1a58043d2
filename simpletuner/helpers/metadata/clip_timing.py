"""Re-timing a clip to a target frame rate (the ``video`` block's ``fps``); pure and exact.

A clip of N frames at rate R shows frame i during [i/R, (i+1)/R), so it lasts N/R seconds.
Re-timed to T, its frame k is what is on screen at k/T: source frame floor(k*R/T), for every k
with k/T before the end, which is ceil(N*T/R) frames. Faster sources lose frames, slower ones
repeat them; a clip already at T is unchanged. Rates are the probe's exact 'num/den', so
30000/1001 never drifts. The decoder (multiaspect/clip.py) picks frames by their timestamps on
the same grid, so the count decided here is the count it delivers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from simpletuner.common.names import printable

NAMED_PER_RATE = 3  # clips named per source rate in the log line; the plan JSON has them all


def parse_rate(rate: str) -> Fraction:
    """A probe's 'num/den' (or an integer) as an exact rate."""
    return Fraction(rate)


def needs_retiming(source_rate: str, target_fps: int | None) -> bool:
    return target_fps is not None and parse_rate(source_rate) != target_fps


def retimed_frames(source_frames: int, source_rate: str, target_fps: int) -> int:
    """Frames of an N-frame clip at ``source_rate`` once re-timed to ``target_fps``."""
    return math.ceil(source_frames * Fraction(target_fps) / parse_rate(source_rate))


def source_slot(frame: int, source_rate: Fraction, target_fps: int) -> int:
    """The source frame (its slot on the 1/R grid) shown at re-timed frame ``frame``."""
    return math.floor(frame * source_rate / target_fps)


def describe_rate(rate: str) -> str:
    """'30/1' as '30', '30000/1001' as '29.97' (for messages; the index keeps the exact one)."""
    value = parse_rate(rate)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.2f}"


def retiming_note(dataset_id: str, target_fps: int, source_rates: Mapping[str, str]) -> str:
    """The log line of a dataset's re-timed clips (sample id -> its source rate)."""
    by_rate: dict[str, list[str]] = {}
    for sample_id, rate in sorted(source_rates.items()):
        by_rate.setdefault(rate, []).append(sample_id)
    parts = []
    for rate, ids in sorted(by_rate.items(), key=lambda item: parse_rate(item[0])):
        named = ", ".join(printable(s) for s in ids[:NAMED_PER_RATE])
        more = f" and {len(ids) - NAMED_PER_RATE} more" if len(ids) > NAMED_PER_RATE else ""
        parts.append(f"{len(ids)} from {describe_rate(rate)} fps ({named}{more})")
    return (f"dataset '{dataset_id}': {len(source_rates)} clips re-timed to {target_fps} fps "
            f"(video.fps): {'; '.join(parts)}")
