"""A metadata table's columns as Arrow arrays, read in batches so a million rows never exist as
Python objects: file names as text (null where not text), sizes as positive whole pixels (0
where not), captions trimmed (null where empty). Only the few bad rows are looked at again as
Python values, to say what is wrong with each.

.parquet is read with pyarrow in record batches; .jsonl is parsed line by line (a line with a
value of the wrong type, or no JSON at all, is one bad row to report, not a table that cannot
be read) and its columns converted once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from simpletuner.helpers.metadata.index_columns import StringColumn

BATCH_ROWS = 1 << 22  # a table of up to this many rows in one row group is one chunk: no copy
MAX_PIXELS_SIDE = 1 << 31  # a side beyond this is no image size (and would not fit int64 math)


class TableFormatError(ValueError):
    """The table cannot be read or lacks a named column."""


@dataclass
class TableColumns:
    names: Any                     # pyarrow ChunkedArray of strings; null: empty, missing, not text
    widths: np.ndarray             # int64; 0: not a positive whole number
    heights: np.ndarray
    captions: Any | None           # pyarrow ChunkedArray of strings, trimmed; null: no caption
    value_of: Callable[[str, int], Any]  # a cell as Python, for the message of a bad row


class ArrowTexts(Sequence):
    """A string column read as Python one cell (or one slice) at a time; with ``rows``, the
    cell of each row (a file's table row, -1: none) instead of the column's own order, so a
    table's captions go to the index cache as they are, not gathered into the files' order."""

    def __init__(self, array, rows: np.ndarray | None = None):
        self.array, self.rows = array, rows

    def __len__(self) -> int:
        return len(self.array) if self.rows is None else len(self.rows)

    def __getitem__(self, item):
        if isinstance(item, slice):
            if self.rows is not None:
                return [self[at] for at in range(*item.indices(len(self)))]
            start, stop, step = item.indices(len(self.array))
            return self.array.slice(start, max(0, stop - start)).to_pylist()[::step]
        if self.rows is not None:
            item = int(self.rows[item])
            if item < 0:
                return None
        return self.array[item].as_py()

    def text_column(self) -> tuple[np.ndarray, np.ndarray]:
        """(blob, starts) of the column's own cells in index_columns.TextColumn's layout, a
        null as an empty text: the Arrow buffers as they are, no Python str per cell."""
        import pyarrow

        offsets, data = string_buffers(self.array.cast(pyarrow.large_string()))  # int64 offsets
        return data[offsets[0]:offsets[-1]], offsets - offsets[0]

    def known(self) -> np.ndarray:
        """Whether each row has a text."""
        valid = self.array.is_valid().to_numpy(zero_copy_only=False)
        return valid if self.rows is None else (self.rows >= 0) & valid[np.maximum(self.rows, 0)]


def string_buffers(texts) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of an Arrow string or large_string array, as numpy views of its
    buffers (no copy): cell i is bytes[offsets[i]:offsets[i + 1]]."""
    import pyarrow

    width = np.int64 if pyarrow.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(texts.buffers()[1], width)[texts.offset:texts.offset + len(texts) + 1]
    data = texts.buffers()[2]
    return offsets, np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)


def read_table(path: Path, filename: str, width: str, height: str,
               captions: list[str]) -> TableColumns:
    """``captions``: the caption column, then its fallback (empty: no captions wanted)."""
    names = list(dict.fromkeys([filename, width, height, *captions]))
    if path.suffix.lower() == ".jsonl":
        return _from_python(_read_jsonl(path, names), filename, width, height, captions)
    return _read_parquet(path, names, filename, width, height, captions)


def _missing_columns(path: Path, wanted: list[str], present: list[str]) -> None:
    missing = [name for name in wanted if name not in present]
    if missing:
        raise TableFormatError(
            f"metadata table {path}: no column {', '.join(map(repr, missing))} (it has "
            f"{', '.join(present)}); fix the parquet block's *_column keys")


def _parquet_batches(path: Path, names: list[str]) -> Iterator:
    """The named columns of a .parquet table, a record batch at a time."""
    import pyarrow  # the 'parquet' extra
    import pyarrow.parquet

    try:
        table_file = pyarrow.parquet.ParquetFile(path)
        _missing_columns(path, names, table_file.schema_arrow.names)
        yield from table_file.iter_batches(batch_size=BATCH_ROWS, columns=names)
    except (OSError, pyarrow.ArrowException) as exc:
        raise TableFormatError(f"metadata table {path}: cannot be read ({exc})") from exc


def _read_parquet(path, names, filename, width, height, captions) -> TableColumns:
    import pyarrow

    parts: dict[str, list] = {"names": [], "widths": [], "heights": [], "captions": []}
    for batch in _parquet_batches(path, names):
        parts["names"].append(_text(batch.column(filename)))
        parts["widths"].append(batch.column(width))
        parts["heights"].append(batch.column(height))
        if captions:
            parts["captions"].append(caption_text([batch.column(n) for n in captions]))
    kinds = {"names": pyarrow.string(), "widths": pyarrow.int64(),
             "heights": pyarrow.int64(), "captions": pyarrow.string()}
    column = {key: pyarrow.chunked_array(chunks, type=chunks[0].type if chunks else kinds[key])
              for key, chunks in parts.items()}
    if not captions:
        column["captions"] = None
    raw = {width: column["widths"], height: column["heights"], filename: column["names"]}
    return TableColumns(column["names"], pixels(column["widths"]), pixels(column["heights"]),
                        column["captions"], lambda name, row: raw[name][row].as_py())


def _read_jsonl(path: Path, names: list[str]) -> dict[str, list]:
    columns: dict[str, list] = {name: [] for name in names}
    present: dict[str, None] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TableFormatError(f"metadata table {path}: cannot be read ({exc})") from exc
    for line in lines:
        try:
            row = json.loads(line) if line.strip() else {}
        except ValueError:
            row = {}
        if not isinstance(row, dict):
            row = {}
        present.update(dict.fromkeys(row))
        for name in names:
            columns[name].append(row.get(name))
    _missing_columns(path, names, list(present))
    return columns


def _python_text(values: list):
    import pyarrow

    return pyarrow.array([v if isinstance(v, str) else None for v in values], pyarrow.string())


def _from_python(columns: dict[str, list], filename, width, height, captions) -> TableColumns:
    import pyarrow

    captioned = caption_text([_python_text(columns[n]) for n in captions]) if captions else None
    return TableColumns(  # one-chunk columns, as a parquet table of one batch gives
        pyarrow.chunked_array([_python_text(columns[filename])]), _python_pixels(columns[width]),
        _python_pixels(columns[height]),
        pyarrow.chunked_array([captioned]) if captioned is not None else None,
        lambda name, row: columns[name][row])


def positive_whole(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 0 < value < MAX_PIXELS_SIDE else None


def _python_pixels(values: list) -> np.ndarray:
    return np.fromiter((positive_whole(v) or 0 for v in values), np.int64, len(values))


def pixels(column) -> np.ndarray:
    """A size column as int64, 0 where a cell is not a positive whole number (null, negative,
    fractional, text, boolean: reported as such)."""
    import pyarrow
    import pyarrow.compute

    kind = column.type
    if pyarrow.types.is_integer(kind):
        values = pyarrow.compute.fill_null(column, 0).to_numpy().astype(np.int64, copy=False)
        usable = (values > 0) & (values < MAX_PIXELS_SIDE)
        return values if usable.all() else np.where(usable, values, 0)
    if pyarrow.types.is_floating(kind):
        values = pyarrow.compute.fill_null(column, 0.0).to_numpy().astype(np.float64)
        whole = (values > 0) & (values < MAX_PIXELS_SIDE) & (values == np.floor(values))
        return np.where(whole, values, 0).astype(np.int64)
    return np.zeros(len(column), dtype=np.int64)


def _text(column):
    """Text cells as strings; anything else (numbers, lists) null, i.e. 'not text'."""
    import pyarrow

    kind = column.type
    if pyarrow.types.is_dictionary(kind):
        kind = kind.value_type
    if pyarrow.types.is_string(kind) or pyarrow.types.is_large_string(kind):
        return column.cast(pyarrow.string())
    return pyarrow.nulls(len(column), pyarrow.string())


def caption_text(columns: list):
    """The first column's caption, trimmed, else the next one's where it is empty."""
    import pyarrow.compute as pc

    chosen = None
    for column in columns:
        trimmed = _trimmed_or_null(_text(column))
        chosen = trimmed if chosen is None else pc.coalesce(chosen, trimmed)
    return chosen


def _trimmed_or_null(texts):
    """``texts`` trimmed of white space, null where nothing is left; the column as it is when
    no cell is empty or could start or end with white space (no copy of the captions)."""
    import pyarrow
    import pyarrow.compute as pc

    if _already_trimmed(texts):
        return texts
    trimmed = pc.utf8_trim_whitespace(texts)
    return pc.if_else(pc.greater(pc.utf8_length(trimmed), 0), trimmed,
                      pyarrow.scalar(None, pyarrow.string()))


def _already_trimmed(texts) -> bool:
    """Every cell (of a string array) null, or not empty with a printable ASCII character
    other than space first and last: a byte outside that may be (part of) white space."""
    offsets, codes = string_buffers(texts)
    starts, ends = offsets[:-1], offsets[1:]
    if texts.null_count:
        valid = texts.is_valid().to_numpy(zero_copy_only=False)
        starts, ends = starts[valid], ends[valid]
    if not len(starts):
        return True
    if np.any(ends <= starts):
        return False
    first, last = codes[starts], codes[ends - 1]
    return bool(np.all((first > 0x20) & (first < 0x7F) & (last > 0x20) & (last < 0x7F)))


def arrow_strings(column: StringColumn):
    """``column`` as an Arrow string array (its bytes without the NULs, no str per cell)."""
    import pyarrow

    data = column.blob.tobytes().replace(b"\0", b"")
    offsets = column.starts - np.arange(len(column.starts), dtype=np.int64)
    kind = pyarrow.string() if len(data) < 1 << 31 else pyarrow.large_string()
    offsets = offsets.astype(np.int32 if kind == pyarrow.string() else np.int64)
    return pyarrow.Array.from_buffers(kind, len(column), [None, pyarrow.py_buffer(offsets),
                                                          pyarrow.py_buffer(data)])


def read_file_names(path: str | Path, column: str) -> list[str]:
    """The distinct file names a table's rows give (a leading '/' dropped), sorted as a
    listing is; rows without a usable name are left out (the index reports them)."""
    import pyarrow
    import pyarrow.compute as pc

    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        names = _python_text(_read_jsonl(path, [column])[column])
    else:
        names = pyarrow.chunked_array([_text(batch.column(column))
                                       for batch in _parquet_batches(path, [column])],
                                      type=pyarrow.string())
    names = pc.unique(pc.utf8_ltrim(names, characters="/")).drop_null()
    names = names.filter(pc.greater(pc.utf8_length(names), 0))
    # Arrow orders strings by their UTF-8 bytes, which is code point order: Python's order.
    return names.take(pc.sort_indices(names)).to_pylist()


def escaping_names(names):
    """Which of ``names`` (Arrow strings) hold a '..' part, as storage.leaves_root decides."""
    import pyarrow.compute as pc

    return pc.match_substring_regex(names, r"(^|/)\.\.(/|$)")

