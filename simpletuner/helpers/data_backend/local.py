"""A dataset folder on the local filesystem: the default storage (see storage.py)."""

from __future__ import annotations

import os
from pathlib import Path

from simpletuner.common.atomic import atomic_write_bytes
from simpletuner.helpers.data_backend.storage import (
    CAPTION_EXTENSION, IMAGE_EXTENSIONS, FileVersion, Listing, extension_of,
    special_file_reason,
)


class LocalStorage:
    """Samples (images, or the ``extensions`` given) under ``root``, named by sample id. Hidden
    files and folders are ignored."""

    remote = False
    max_connections = 1  # never asked: local headers are read by worker processes

    def __init__(self, root: str | os.PathLike, extensions: frozenset[str] = IMAGE_EXTENSIONS):
        self.root = Path(root)
        self.location = str(self.root)
        self.extensions = extensions

    def path(self, sample_id: str) -> Path:
        return self.root.joinpath(*sample_id.split("/"))

    def list_files(self) -> Listing:
        """Walk the tree once. Symlinked folders are followed, each real folder only once.
        Only regular files are samples or captions: a named pipe, socket or device is listed
        as unreadable with its kind, never opened."""
        sample_ids: list[str] = []
        sizes: list[int] = []
        mtimes_ns: list[int] = []
        captions: dict[str, None] = {}
        unreadable: list[tuple[str, str]] = []
        visited: set[str] = set()
        pending: list[tuple[str, str]] = [(str(self.root), "")]  # (folder path, id prefix)
        while pending:
            folder, prefix = pending.pop()
            real = os.path.realpath(folder)
            if real in visited:  # a symlink loop, or a second link to the same folder
                continue
            visited.add(real)
            try:
                entries = list(os.scandir(folder))
            except OSError as exc:
                reason = f"folder cannot be listed ({exc.strerror})"
                unreadable.append((prefix.rstrip("/") or ".", reason))
                continue
            for entry in entries:
                name = entry.name
                if name.startswith("."):  # hidden
                    continue
                sample_id = prefix + name
                try:
                    if entry.is_dir():  # follows symlinks
                        pending.append((entry.path, sample_id + "/"))
                        continue
                    dot = name.rfind(".")  # extension_of, inlined: this runs once a file
                    extension = name[dot:].lower() if dot > 0 else ""
                    if extension != CAPTION_EXTENSION and extension not in self.extensions:
                        continue
                    if not entry.is_file():  # follows symlinks; a pipe would block its reader
                        unreadable.append((sample_id, special_file_reason(entry.stat().st_mode)))
                    elif extension == CAPTION_EXTENSION:  # captions are '<stem>.txt'
                        captions[sample_id] = None  # read on demand, so never compared
                    else:
                        stat = entry.stat()
                        sample_ids.append(sample_id)
                        sizes.append(stat.st_size)
                        mtimes_ns.append(stat.st_mtime_ns)
                except OSError as exc:
                    # e.g. a dangling symlink: report it, do not lose it silently
                    if extension_of(name) in self.extensions:
                        unreadable.append((sample_id, f"cannot be read ({exc.strerror})"))
        order = sorted(range(len(sample_ids)), key=sample_ids.__getitem__)
        unreadable.sort()
        return Listing([sample_ids[i] for i in order], [sizes[i] for i in order],
                       [mtimes_ns[i] for i in order], captions, unreadable)

    def versions(self, names: list[str]) -> dict[str, FileVersion]:
        found = {}
        for name in names:
            try:
                stat = self.path(name).stat()
            except OSError:  # missing or unreadable: the caller reports it as a failure
                continue
            found[name] = FileVersion(stat.st_size, stat.st_mtime_ns)
        return found

    def read_range(self, name: str, start: int, length: int) -> bytes:
        with open(self.path(name), "rb") as handle:
            handle.seek(start)
            return handle.read(length)

    def read_bytes(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def write_atomic(self, name: str, data: bytes) -> None:
        atomic_write_bytes(self.path(name), data)

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def local_path(self, name: str) -> Path:
        return self.path(name)

    def identity(self, name: str) -> str:
        return str(self.path(name).resolve())
