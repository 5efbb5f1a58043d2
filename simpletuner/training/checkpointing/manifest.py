"""A checkpoint's manifest: the name, size and SHA-256 of every file in its folder.

Written last, after every file and the folder itself are flushed to disk, so its presence means
the save completed; verifying it before a resume catches a file that was truncated, removed, or
overwritten since. Format (``manifest.json``)::

    {"format": 1, "files": {"model.safetensors": {"size": 1234, "sha256": "<hex>"}, ...}}
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from simpletuner.common.atomic import atomic_write_json, fsync_directory

MANIFEST = "manifest.json"
FORMAT = 1
_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or used; the message names the file and why."""


def reason(exc: BaseException) -> str:
    """Why an I/O call failed, without repeating the path the caller already names."""
    if isinstance(exc, OSError) and exc.strerror:
        code = errno.errorcode.get(exc.errno) if exc.errno else None
        return f"{exc.strerror} ({code})" if code else exc.strerror
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def naming_file(path: Path, action: str) -> Iterator[None]:
    """Turn any failure inside into one CheckpointError: '<action> <path>: <why>'."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"could not {action} {path}: {reason(exc)}") from exc


def _sha256(path: Path, *, flush: bool = False) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
        if flush:  # every file is on disk before the manifest vouches for it
            os.fsync(handle.fileno())
    return sha.hexdigest()


def write_manifest(folder: Path) -> None:
    """Hash and flush every file in ``folder``, flush the folder, then write the manifest."""
    files = {}
    for path in sorted(p for p in folder.iterdir() if p.name != MANIFEST):
        with naming_file(path, "flush"):
            files[path.name] = {"size": path.stat().st_size, "sha256": _sha256(path, flush=True)}
    with naming_file(folder, "flush"):
        fsync_directory(folder)
    with naming_file(folder / MANIFEST, "write"):
        atomic_write_json(folder / MANIFEST, {"format": FORMAT, "files": files}, indent=1)
        fsync_directory(folder)


def has_manifest(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def _read_manifest(folder: Path) -> dict[str, dict]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest["format"] != FORMAT or not isinstance(files, dict):
            raise ValueError(f"format {manifest['format']!r}, expected {FORMAT}")
        return {name: {"size": int(e["size"]), "sha256": str(e["sha256"])}
                for name, e in files.items()}
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing, so the save never completed") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest ({reason(exc)})") from exc


def verify_checkpoint(folder: Path) -> None:
    """Raise CheckpointError naming the first file that is missing or differs from the
    manifest (size first, the cheap check, then SHA-256)."""
    for name, expected in sorted(_read_manifest(folder).items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing file (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{path}: size mismatch ({size} bytes, the manifest says "
                                  f"{expected['size']}); the file was truncated or changed")
        with naming_file(path, "read"):
            digest = _sha256(path)
        if digest != expected["sha256"]:
            raise CheckpointError(f"{path}: SHA-256 mismatch; the file changed after it was "
                                  "saved (disk or copy corruption)")

