"""The storage interface: where a dataset's bytes live, behind six calls.

Discovery, captions, caching and the audit use only this, so none of them knows whether a
dataset is a local folder (local.py) or an S3-compatible bucket (s3.py). Names are sample ids:
paths relative to the dataset root with '/' separators.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff"})
VIDEO_EXTENSIONS = frozenset({".mp4", ".webm", ".mkv", ".mov", ".avi"})
CAPTION_EXTENSION = ".txt"

ChangeKey = int | str  # local: mtime_ns; S3: the ETag. With the size, it says "same bytes".


class StorageError(OSError):
    """Storage cannot be reached (past its retries) or refuses us; the message says which and
    what to do. An OSError like any failed read, but never a fault of one file: code that skips
    an unreadable file lets this through, so an outage stops the run instead of shrinking the
    dataset."""


@dataclass
class Listing:
    """One listing of the storage, sorted by sample id whatever order the storage gave.

    The images are three parallel columns rather than an object per file: a dataset of millions
    of files stays three lists, which are cheap to build, compare and keep (no per-file objects
    for the garbage collector to walk).
    """

    sample_ids: list[str]
    sizes: list[int]                 # bytes
    change_keys: list[ChangeKey]
    captions: dict[str, ChangeKey | None]  # caption file id -> change key (None: not listed)
    unreadable: list[tuple[str, str]] = field(default_factory=list)  # (sample id, reason)


@dataclass(frozen=True)
class FileVersion:
    size: int
    change_key: ChangeKey


_SPECIAL_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def special_file_reason(mode: int) -> str:
    """Why a listed name that is not a regular file is skipped: opening a named pipe would
    wait for a writer forever, and a device never ends."""
    kind = next((name for test, name in _SPECIAL_KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


def leaves_root(name: str) -> bool:
    """Whether a name given by a table, not found by listing, may reach outside the dataset's
    root. Any '..' part may, lexically or through a symlinked folder before it, so every name
    holding one is refused rather than resolved."""
    return ".." in name.split("/")


def extension_of(name: str) -> str:
    """'.jpg' for 'a/B.JPG'; '' for hidden or extension-less names."""
    base = name.rsplit("/", 1)[-1]
    dot = base.rfind(".")
    return base[dot:].lower() if dot > 0 else ""


def is_image_name(name: str) -> bool:
    return extension_of(name) in IMAGE_EXTENSIONS


class Storage(Protocol):
    location: str  # e.g. '/data/photos' or 's3://bucket/prefix'; never holds a credential
    remote: bool   # reads cost a round trip: probe with ranged reads, prefetch captions
    max_connections: int  # requests worth making at once (remote storage)

    def list_files(self) -> Listing: ...

    def versions(self, names: list[str]) -> dict[str, FileVersion]:
        """Size and change key of each of ``names`` that exists (one bulk call: a cache asks
        for every sample's at once)."""

    def read_range(self, name: str, start: int, length: int) -> bytes: ...

    def read_bytes(self, name: str) -> bytes: ...

    def write_atomic(self, name: str, data: bytes) -> None:
        """Readers see the old bytes or the new ones, never part of them."""

    def exists(self, name: str) -> bool: ...

    def local_path(self, name: str) -> Path | None:
        """The file on this machine, for readers that are fastest with a path; None if remote."""

    def identity(self, name: str) -> str:
        """A stable name for cache keys (absolute path or s3:// URL), without credentials."""
