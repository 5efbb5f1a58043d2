"""How many CPU cores this process may run on (its affinity, which a scheduler or taskset may
have narrowed; os.cpu_count counts the whole machine)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
