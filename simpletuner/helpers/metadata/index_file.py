"""A file of named numpy columns and a JSON header, read memory-mapped and never trusted unchecked.

Layout: ``MAGIC``, the header's length (8 bytes, little-endian), the header (UTF-8 JSON: the
caller's ``meta``, each column's dtype, offset and length, the file's size), each column at a
64-byte aligned offset, and last the CRC-32 of everything before it (4 bytes, little-endian).
A reader checks the size (a truncated file) and the CRC (a damaged one) before it maps a single
column: CRC-32 because it runs at about 3x SHA-256's speed here and the check is against
damage, not forgery (a few tenths of a second at 10 M samples). No pickles: only the plain
dtypes in ``_DTYPES`` are written or read. A new file always replaces the old by rename, never
by writing into it, so a process that mapped the old one keeps reading what it checked.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simpletuner.common.atomic import atomic_write_with

MAGIC = b"STIDX01\n"
_ALIGN = 64
_CHUNK = 1 << 24  # the CRC is computed reading this much at a time: no copy of the file in memory
_DTYPES = {"<i8", "<i4", "|u1", "|b1"}


class IndexFileError(ValueError):
    """The file is missing, truncated, damaged or not one this code wrote."""


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _layout(meta: Mapping[str, Any], columns: Mapping[str, np.ndarray]) -> bytes:
    """The file's start (magic, header length, header, padding); a column's offset counts from
    the file's start, so the header's own length decides them: found by iterating to a fixed
    point (the offsets' digits change the header's length at most a few times)."""
    start = 0
    while True:
        offset, placed = _aligned(start), {}
        for name, values in columns.items():
            placed[name] = [values.dtype.str, offset, int(values.size)]
            offset = _aligned(offset + values.nbytes)
        header = json.dumps({"meta": meta, "columns": placed, "size": offset + 4},
                            sort_keys=True).encode("utf-8")
        if len(MAGIC) + 8 + len(header) <= start:
            head = MAGIC + len(header).to_bytes(8, "little") + header
            return head + bytes(_aligned(start) - len(head))
        start = len(MAGIC) + 8 + len(header)


def write_columns(path: str | os.PathLike, meta: Mapping[str, Any],
                  columns: Mapping[str, np.ndarray]) -> None:
    """Write ``columns`` (1-D arrays of the dtypes in _DTYPES) and ``meta`` (JSON) atomically."""
    columns = {name: np.ascontiguousarray(values) for name, values in columns.items()}
    for name, values in columns.items():
        if values.ndim != 1 or values.dtype.str not in _DTYPES:
            raise ValueError(f"column {name!r}: {values.dtype.str} x {values.ndim}-D is not stored")
    head = _layout(meta, columns)

    def write(tmp_name: str) -> None:
        with open(tmp_name, "wb") as out:
            crc = _write(out, head, 0)
            for values in columns.values():
                crc = _write(out, memoryview(values).cast("B"), crc)
                crc = _write(out, bytes(_aligned(out.tell()) - out.tell()), crc)
            out.write(crc.to_bytes(4, "little"))

    atomic_write_with(path, write)


def _write(out, data, crc: int) -> int:
    out.write(data)
    return zlib.crc32(data, crc)


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
    start = source.read(len(MAGIC) + 8)
    if len(start) < len(MAGIC) + 8 or start[:len(MAGIC)] != MAGIC:
        raise IndexFileError("not an index file (no magic number)")
    length = int.from_bytes(start[len(MAGIC):], "little")
    if length > size:
        raise IndexFileError("truncated: its header runs past the end")
    try:
        header = json.loads(source.read(length).decode("utf-8"))
    except ValueError as exc:
        raise IndexFileError(f"a damaged header ({exc})") from exc
    if not (isinstance(header, dict) and isinstance(header.get("meta"), dict)
            and isinstance(header.get("columns"), dict) and isinstance(header.get("size"), int)):
        raise IndexFileError("a damaged header (meta, columns or size missing)")
    if header["size"] != size:
        raise IndexFileError(f"truncated or extended: {size} bytes, written as {header['size']}")
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
