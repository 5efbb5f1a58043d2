"""A file of named numpy columns and a JSON header, read memory-mapped and never trusted unchecked.

Layout: ``MAGIC``, each column at a 64-byte aligned offset, the header (UTF-8 JSON: the caller's
``meta``, each column's dtype, offset and length), then the footer: the header's length and the
file's size (8 bytes each, little-endian) and last the CRC-32 of everything before it (4 bytes).
The header comes last so the columns can go to disk while the caller still works out the meta
(its digests hash them): ColumnFileWriter writes them in a thread of its own. A reader checks
the size (a truncated file) and the CRC (a damaged one) before it maps a single column: CRC-32
because it runs at about 3x SHA-256's speed here and the check is against damage, not forgery
(a few tenths of a second at 10 M samples). No pickles: only the plain dtypes in ``_DTYPES``
are written or read. A new file always replaces the old by rename, never by writing into it, so
a process that mapped the old one keeps reading what it checked. Files of the earlier layout
(``MAGIC_HEADER_FIRST``: the header first, with the size in it) are still read.
"""

from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simpletuner.common.atomic import Replacement, naming_path

MAGIC = b"STIDX02\n"
MAGIC_HEADER_FIRST = b"STIDX01\n"
_FOOTER = 8 + 8 + 4  # the header's length, the file's size, the CRC
_ALIGN = 64
_CHUNK = 1 << 24  # the CRC is computed reading this much at a time: no copy of the file in memory
_DTYPES = {"<i8", "<i4", "|u1", "|b1"}


class IndexFileError(ValueError):
    """The file is missing, truncated, damaged or not one this code wrote."""


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class ColumnFileWriter:
    """A column file written while its later columns and its meta are still being worked out:
    each added column goes to disk in a thread of its own (the kernel's copy into the page
    cache and the CRC overlap the caller's work), the header last. ``commit(meta)`` finishes
    the file and renames it over ``path``; leaving the ``with`` block without a commit removes
    it. Added arrays must not change until then. A failed write (a full disk) raises from
    ``commit``, naming ``path``. ``write_early`` False holds every write until ``commit``, for
    a file that may well be dropped."""

    def __init__(self, path: str | os.PathLike, *, write_early: bool = True):
        self.path = Path(path)
        self._held: list | None = None if write_early else []  # writes waiting for commit
        self.columns: dict[str, np.ndarray] = {}  # as added, for the caller's digests
        self._placed: dict[str, list] = {}
        self._end = len(MAGIC)  # queued in __enter__
        self._crc = 0
        self._writes: list[Future] = []

    def __enter__(self) -> "ColumnFileWriter":
        with naming_path(self.path):
            self._replacement = Replacement(self.path)
            try:
                self._out = open(self._replacement.name, "wb", buffering=0)  # nothing to flush
            except BaseException:
                self._replacement.__exit__(None, None, None)
                raise
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="column-file")
        self._queue(MAGIC)
        return self

    def add(self, columns: Mapping[str, np.ndarray]) -> None:
        """Columns: 1-D arrays of the dtypes in _DTYPES, each name once."""
        for name, values in columns.items():
            values = np.ascontiguousarray(values)
            if values.ndim != 1 or values.dtype.str not in _DTYPES or name in self.columns:
                raise ValueError(f"column {name!r}: {values.dtype.str} x {values.ndim}-D "
                                 "is not stored (or added twice)")
            start = _aligned(self._end)
            self._queue(bytes(start - self._end))
            self._queue(memoryview(values).cast("B"))
            self.columns[name] = values
            self._placed[name] = [values.dtype.str, start, int(values.size)]
            self._end = start + values.nbytes

    def commit(self, meta: Mapping[str, Any]) -> None:
        header = json.dumps({"meta": meta, "columns": self._placed},
                            sort_keys=True).encode("utf-8")
        size = self._end + len(header) + _FOOTER
        self._queue(header + len(header).to_bytes(8, "little") + size.to_bytes(8, "little"))
        held, self._held = self._held or [], None
        for data in held:
            self._queue(data)
        with naming_path(self.path):
            for write in self._writes:
                write.result()  # the first failed write's error
            self._write(self._crc.to_bytes(4, "little"))
            self._out.close()
            self._replacement.commit()

    def _queue(self, data) -> None:
        if self._held is not None:
            self._held.append(data)
        else:
            self._writes.append(self._thread.submit(self._write, data))

    def _write(self, data) -> None:
        self._crc = zlib.crc32(data, self._crc)
        left = memoryview(data).cast("B")
        while left:  # a raw write may take part of it
            left = left[self._out.write(left):]

    def __exit__(self, *exc_info) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
        self._out.close()
        self._replacement.__exit__(*exc_info)


def write_columns(path: str | os.PathLike, meta: Mapping[str, Any],
                  columns: Mapping[str, np.ndarray]) -> None:
    """Write ``columns`` (1-D arrays of the dtypes in _DTYPES) and ``meta`` (JSON) atomically."""
    with ColumnFileWriter(path) as writer:
        writer.add(columns)
        writer.commit(meta)


def read_columns(path: str | os.PathLike, *, check_crc: bool = True
                 ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta, columns memory-mapped read-only), once size and CRC are checked (``check_crc``
    False: the caller has just written and flushed this very file)."""
    path = Path(path)
    try:
        with open(path, "rb") as source:
            header = _read_header(source, os.fstat(source.fileno()).st_size)
            if check_crc:
                _check_crc(source, header["size"])
    except OSError as exc:
        raise IndexFileError(f"cannot read {path}: {exc}") from exc
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    columns = {}
    for name, (dtype, offset, count) in header["columns"].items():
        if dtype not in _DTYPES:
            raise IndexFileError(f"{path}: column {name!r} has dtype {dtype}")
        end = offset + count * np.dtype(dtype).itemsize
        if not 0 <= offset <= end <= len(whole):
            raise IndexFileError(f"{path}: column {name!r} lies outside the file")
        columns[name] = whole[offset:end].view(dtype)
    return header["meta"], columns


def _read_header(source, size: int) -> dict[str, Any]:
    magic = source.read(len(MAGIC))
    if magic == MAGIC_HEADER_FIRST:
        return _read_header_first(source, size)
    if magic != MAGIC:
        raise IndexFileError("not an index file (no magic number)")
    if size < len(MAGIC) + _FOOTER:
        raise IndexFileError("truncated: no footer")
    source.seek(size - _FOOTER)
    footer = source.read(_FOOTER - 4)  # the CRC is checked with the rest
    length, written_size = (int.from_bytes(footer[at:at + 8], "little") for at in (0, 8))
    if written_size != size:
        raise IndexFileError(f"truncated or extended: {size} bytes, written as {written_size}")
    if length > size - _FOOTER - len(MAGIC):
        raise IndexFileError("damaged: its header would start before the columns")
    source.seek(size - _FOOTER - length)
    return {**_parse_header(source.read(length)), "size": size}


def _read_header_first(source, size: int) -> dict[str, Any]:
    """The earlier layout: the header's length and the header after the magic number."""
    length = int.from_bytes(source.read(8), "little")
    if length > size:
        raise IndexFileError("truncated: its header runs past the end")
    header = _parse_header(source.read(length))
    if header.get("size") != size:
        raise IndexFileError(f"truncated or extended: {size} bytes, written as "
                             f"{header.get('size')}")
    return header


def _parse_header(text: bytes) -> dict[str, Any]:
    try:
        header = json.loads(text.decode("utf-8"))
    except ValueError as exc:
        raise IndexFileError(f"a damaged header ({exc})") from exc
    if not (isinstance(header, dict) and isinstance(header.get("meta"), dict)
            and isinstance(header.get("columns"), dict)):
        raise IndexFileError("a damaged header (meta or columns missing)")
    return header


def _check_crc(source, size: int) -> None:
    source.seek(0)
    crc, left, buffer = 0, size - 4, bytearray(min(_CHUNK, max(size - 4, 1)))
    view = memoryview(buffer)
    while left:
        got = source.readinto(view[:min(left, len(buffer))])
        if not got:
            raise IndexFileError("truncated while reading")
        crc = zlib.crc32(view[:got], crc)
        left -= got
    if int.from_bytes(source.read(4), "little") != crc:
        raise IndexFileError("damaged: its CRC-32 does not match its content")
