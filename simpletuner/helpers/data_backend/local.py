"""A dataset folder on the local filesystem: list its images, read their bytes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff"})
CAPTION_EXTENSION = ".txt"


@dataclass
class Listing:
    """One walk of the folder, sorted by sample id whatever the directory order.

    The images are three parallel columns rather than an object per file: a dataset of millions
    of files stays three lists, which are cheap to build, compare and keep (no per-file objects
    for the garbage collector to walk).
    """

    sample_ids: list[str]  # paths relative to the root, '/' separators
    sizes: list[int]       # bytes
    mtimes_ns: list[int]
    captions: set[str]                                    # sample ids of the .txt files
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (sample id, reason)


def _is_image_name(name: str) -> bool:
    """Whether a file name that is not hidden has an image extension (any case)."""
    dot = name.rfind(".")
    return dot > 0 and name[dot:].lower() in IMAGE_EXTENSIONS


class LocalDataBackend:
    """Images under ``root``, named by sample id. Hidden files and folders are ignored."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, sample_id: str) -> Path:
        return self.root.joinpath(*sample_id.split("/"))

    def list_files(self) -> Listing:
        """Walk the tree once. Symlinked folders are followed, each real folder only once."""
        sample_ids: list[str] = []
        sizes: list[int] = []
        mtimes_ns: list[int] = []
        captions: set[str] = set()
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
                    dot = name.rfind(".")  # _is_image_name, inlined: this runs once a file
                    extension = name[dot:].lower() if dot > 0 else ""
                    if extension == CAPTION_EXTENSION:  # captions are '<stem>.txt'
                        captions.add(sample_id)
                    elif extension in IMAGE_EXTENSIONS:
                        stat = entry.stat()
                        sample_ids.append(sample_id)
                        sizes.append(stat.st_size)
                        mtimes_ns.append(stat.st_mtime_ns)
                except OSError as exc:
                    # e.g. a dangling symlink: report it, do not lose it silently
                    if _is_image_name(name):
                        unreadable.append((sample_id, f"cannot be read ({exc.strerror})"))
        order = sorted(range(len(sample_ids)), key=sample_ids.__getitem__)
        unreadable.sort()
        return Listing([sample_ids[i] for i in order], [sizes[i] for i in order],
                       [mtimes_ns[i] for i in order], captions, unreadable)

    def exists(self, sample_id: str) -> bool:
        return self.path(sample_id).is_file()

    def open(self, sample_id: str) -> BinaryIO:
        return open(self.path(sample_id), "rb")

    def read_bytes(self, sample_id: str) -> bytes:
        return self.path(sample_id).read_bytes()
