"""Append-only JSON-lines logs that a resumed run first cuts back: a crashed run wrote records
past its last checkpoint, and the resumed run writes those records again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from simpletuner.common.atomic import atomic_write_bytes


def keep_leading_records(path: Path, keep: Callable[[dict], bool]) -> None:
    """Keep, atomically, the leading lines that are complete records ``keep`` accepts.

    Lines are in the order they were written, so the kept lines are a prefix: the first line
    ``keep`` refuses, torn by the crash or otherwise damaged, ends it. No file: nothing to cut.
    """
    if not path.is_file():
        return
    kept = bytearray()
    with open(path, "rb") as handle:
        for line in handle:
            if not _is_kept(line, keep):
                break
            kept += line
    atomic_write_bytes(path, bytes(kept))


def _is_kept(line: bytes, keep: Callable[[dict], bool]) -> bool:
    if not line.endswith(b"\n"):
        return False  # torn by the crash
    try:
        return bool(keep(json.loads(line)))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return False
