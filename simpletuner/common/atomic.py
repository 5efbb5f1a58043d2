"""Atomic file writes: readers see the old file or the new one, never a half-written one."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from simpletuner.common.stale_temporaries import temporary_prefix

_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors (Rust) reports errno


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


_UNIQUE_TRIES = 100


def _unique_name(parent: Path, prefix: str, suffix: str, create: Callable[[Path], None]) -> Path:
    """Create a new entry named ``prefix<random>suffix`` in ``parent`` with ``create``, which
    must raise FileExistsError when the name is taken."""
    for _ in range(_UNIQUE_TRIES):
        candidate = parent / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            create(candidate)
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name {prefix}*{suffix} in {parent}")


def staging_folder(parent: str | os.PathLike, prefix: str) -> Path:
    """A new empty folder in ``parent``, to fill and rename into place. Made with the umask's
    permissions: tempfile.mkdtemp's 0700 would survive the rename, so others on a shared host
    could not read an export."""
    return _unique_name(Path(parent), prefix, "", lambda path: path.mkdir())


def give_umask_modes(folder: str | os.PathLike) -> None:
    """Give every file under ``folder`` (made by staging_folder) the permissions the umask gives
    new files, read from the folder's own: a writer may make its files private (safetensors
    renames a 0600 temporary file into place), which would leave an export unreadable."""
    mode = stat.S_IMODE(os.stat(folder).st_mode) & 0o666
    for root, _, names in os.walk(folder):
        for name in names:
            os.chmod(os.path.join(root, name), mode)


def _new_file(path: Path) -> None:
    """Like mkstemp, but with the umask's permissions (mkstemp's are 0600)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


@contextmanager
def naming_path(path: str | os.PathLike) -> Iterator[None]:
    """A write that fails inside raises an OSError naming ``path``, with the errno: write()
    reports a full disk without a file name, and safetensors as a SafetensorError without one."""
    try:
        yield
    except (OSError, SafetensorError) as exc:
        if isinstance(exc, OSError):
            code = exc.errno
        else:
            found = _OS_ERROR.search(str(exc))
            code = int(found.group(1)) if found else None
        if code:
            raise OSError(code, os.strerror(code), str(path)) from exc
        raise OSError(f"cannot write {path}: {exc}") from exc


class Replacement:
    """A new temporary file beside ``path`` (in the same folder, so the rename is a
    same-filesystem one; with the permissions the umask gives new files), made to replace it:
    ``commit()`` flushes it to disk and renames it over ``path``; leaving the ``with`` block
    without a commit removes it. Parent folders are created."""

    def __init__(self, path: str | os.PathLike):
        self.target = Path(path)
        self.target.parent.mkdir(parents=True, exist_ok=True)
        # the name carries the writer, so a later run can tell a killed write's file
        self.name = str(_unique_name(self.target.parent, temporary_prefix(self.target.name),
                                     ".tmp", _new_file))
        self._mode = stat.S_IMODE(os.stat(self.name).st_mode)  # the umask's
        self._committed = False

    def commit(self) -> None:
        os.chmod(self.name, self._mode)  # a writer may have replaced it (safetensors: 0600)
        fsync_file(self.name)
        os.replace(self.name, self.target)
        self._committed = True

    def __enter__(self) -> "Replacement":
        return self

    def __exit__(self, *exc_info) -> None:
        if not self._committed:
            try:
                os.unlink(self.name)
            except FileNotFoundError:
                pass


def atomic_write_with(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(temporary_path)``, flush that file to disk, then rename it over ``path``
    (a Replacement). For writers that only take a path (safetensors' ``save_file``). On any
    failure the temporary file is removed."""
    with naming_path(path), Replacement(path) as temporary:
        write(temporary.name)
        temporary.commit()


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
