"""Atomic file writes: readers see the old file or the new one, never a half-written one."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file that someone else wrote (e.g. a library given only a path) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: str | os.PathLike) -> None:
    """Flush a folder's entries, so a rename or a new file in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_with(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(temporary_path)``, flush that file to disk, then rename it over ``path``.

    For writers that only take a path (safetensors' ``save_file``). The temporary file lives in
    the same folder so ``os.replace`` is a same-filesystem rename. Parent folders are created.
    On any failure the temporary file is removed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp_name)
        # mkstemp creates 0600 (and a writer may keep it); give the usual permissions.
        os.chmod(tmp_name, 0o644)
        fsync_file(tmp_name)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk, then rename it over."""
    atomic_write_with(path, lambda tmp_name: Path(tmp_name).write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, value: Any, *, indent: int | None = None) -> None:
    """Keys are sorted so the same value always gives the same bytes."""
    if indent is None:  # the large caches: written as they are encoded, never whole in memory
        atomic_write_with(path, lambda tmp_name: _write_json_file(tmp_name, value))
        return
    atomic_write_text(path, json_text(value, indent=indent) + "\n")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogates(text: str) -> str:
    # Outside strings JSON has no non-ASCII character, so each one found is inside a string,
    # where its \uXXXX escape is valid JSON that json.loads reads back to the same str.
    if text.isascii():  # the usual case, checked far faster than the pattern is searched
        return text
    return _LONE_SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def json_text(value: Any, *, indent: int | None = None) -> str:
    """json.dumps(value, sort_keys=True, ensure_ascii=False), except that lone surrogates (file
    names that are not UTF-8, see common/names.py) are escaped: the text always encodes as
    UTF-8 and round-trips losslessly."""
    return _escape_surrogates(json.dumps(value, indent=indent, sort_keys=True,
                                         ensure_ascii=False))


LONG_LIST = 1 << 16  # a list longer than this is encoded a slice at a time


def _write_json_file(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as out:
        _write_json(value, out)
        out.write("\n")


def _write_json(value: Any, out) -> None:
    """The text json_text(value) gives, in pieces: a cache of a million file names and
    captions never exists as one string (nor as its bytes).
    Long sequences may be any Sequence whose slices are lists (e.g. an Arrow column's view)."""
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        out.write("{")
        for number, key in enumerate(sorted(value)):
            out.write(", " if number else "")
            out.write(json_text(key) + ": ")
            _write_json(value[key], out)
        out.write("}")
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and (
            len(value) > LONG_LIST or not isinstance(value, (list, tuple))):
        out.write("[")
        for start in range(0, len(value), LONG_LIST):
            part = list(value[start:start + LONG_LIST])
            out.write((", " if start else "") + json_text(part)[1:-1])
        out.write("]")
    else:
        out.write(json_text(value))
