"""How much of a run's wall time the GPU ran nothing: from a torch.profiler trace, the union of
kernel, copy and memset intervals inside a window that the run marks at each step's end.

Idle time is the device waiting for the host: for data, for a host/device synchronisation, or
for Python to queue the next kernels. A loop that never makes the device wait has a share near 0;
a tiny model whose kernels take microseconds is bound by kernel launches, so both sides of the
benchmark show a large share there and the difference between them is what the trainer adds.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STEP_MARK = "bench/step-done"
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def mark_step() -> None:
    """A zero-length annotation in the profiler trace (nearly free when nothing profiles)."""
    with torch.profiler.record_function(STEP_MARK):
        pass


def busy_time(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Length of the union of ``intervals`` clipped to [start, end] (streams may overlap)."""
    covered, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered


def idle_share(events: list[dict], warmup: int) -> float | None:
    """1 - busy / wall between the ``warmup``-th step mark and the last one; None without marks."""
    marks = sorted(e["ts"] for e in events  # the host's marks, not their GPU-timeline twins
                   if e.get("name") == STEP_MARK and e.get("cat") == "user_annotation")
    if len(marks) <= warmup + 1:
        return None
    start, end = marks[warmup], marks[-1]
    intervals = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                 if e.get("cat") in DEVICE_CATEGORIES]
    return round(1 - busy_time(intervals, start, end) / (end - start), 4)


def profiled(run: Callable[[], Any], warmup: int) -> tuple[Any, float | None]:
    """``run()`` under the profiler; its result and the device's idle share."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        result = run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        profile.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return result, idle_share(events, warmup)
