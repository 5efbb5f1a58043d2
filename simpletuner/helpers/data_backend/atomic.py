"""Atomic file writes: readers see the old file or the new one, never a half-written one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, then rename it over.

    The temporary file lives in the same folder so ``os.replace`` is a same-filesystem rename.
    Parent folders are created. On any failure the temporary file is removed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; give the file the usual permissions of a written file.
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, value: Any, *, indent: int | None = None) -> None:
    """Keys are sorted so the same value always gives the same bytes."""
    text = json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False)
    atomic_write_text(path, text + "\n")
