"""Metadata backend 'parquet': image sizes (and captions) from a table, no image opened.

SimpleTuner's ``parquet`` block names the table (.parquet, or .jsonl with one object a line)
and its columns. Each row names a file in the storage; a row that cannot be used is reported
with its row number and what is wrong, and skipped: an empty file name, a size that is not a
positive whole number, a file the storage does not hold, a second row for the same file, no
caption for caption_strategy 'parquet'. Listed images without a row are reported too. The
result is the same FileTable header probes give, so the index is the one discovery builds.
"""

from __future__ import annotations

import json
import os
import posixpath
from itertools import repeat
from pathlib import Path

import numpy as np

from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import SkippedFile


class TableFormatError(ValueError):
    """The table cannot be read or lacks a named column."""


def read_columns(path: Path, names: list[str]) -> dict[str, list]:
    """The named columns of a .parquet or .jsonl table as Python lists (row i at index i)."""
    if path.suffix.lower() == ".jsonl":
        columns, present = _read_jsonl(path, names)
    else:
        columns, present = _read_parquet(path, names)
    missing = [name for name in names if name not in present]
    if missing:
        raise TableFormatError(
            f"metadata table {path}: no column {', '.join(map(repr, missing))} (it has "
            f"{', '.join(present)}); fix the parquet block's *_column keys")
    return columns


def _read_parquet(path: Path, names: list[str]) -> tuple[dict[str, list], list[str]]:
    import pyarrow  # the 'parquet' extra
    import pyarrow.parquet

    try:
        present = pyarrow.parquet.read_schema(path).names
        if not set(names) <= set(present):
            return {}, present
        table = pyarrow.parquet.read_table(path, columns=names)
    except (OSError, pyarrow.ArrowException) as exc:
        raise TableFormatError(f"metadata table {path}: cannot be read ({exc})") from exc
    return {name: table.column(name).to_pylist() for name in names}, present


def _read_jsonl(path: Path, names: list[str]) -> tuple[dict[str, list], list[str]]:
    """One object a line, parsed line by line: a line with a value of the wrong type (or no
    JSON at all) is one bad row to report, not a table that cannot be read."""
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
    return columns, list(present)


def _positive_whole(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def _whole_pixels(values: list) -> "np.ndarray":
    """A size column as int64, 0 where a value is not a positive whole number. A column of
    plain ints (the usual table) converts in one step; anything else value by value."""
    if all(type(v) is int for v in values):
        array = np.array(values, dtype=np.int64)
        return np.where(array > 0, array, 0)
    return np.fromiter((_positive_whole(v) or 0 for v in values), np.int64, len(values))


class TableSource:
    """``metadata_backend: parquet``."""

    def __init__(self, storage: Storage, dataset):
        self.storage = storage
        self.config = dataset.parquet_config()
        self.path = Path(self.config.path)
        self.wants_captions = dataset.caption_strategy == "parquet"

    def key(self) -> dict:
        """The table's identity: a new or edited table rebuilds the index."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            raise TableFormatError(f"metadata table {self.path}: cannot be read "
                                   f"({exc.strerror}); check parquet.path") from exc
        c = self.config
        return {"metadata_backend": "parquet", "table": [str(self.path), stat.st_size,
                                                         stat.st_mtime_ns],
                "columns": [c.filename_column, c.width_column, c.height_column,
                            c.caption_column, c.fallback_caption_column,
                            c.identifier_includes_extension]}

    def unchanged(self, listing: Listing, known: FileTable) -> bool:
        """The cached index holds for ``listing``: same files as when it was built (the table's
        identity is in ``key``, so ``known`` comes from this very table)."""
        return (not listing.unreadable and listing.sample_ids == known.ids
                and listing.sizes == known.sizes and listing.change_keys == known.change_keys)

    def read(self, listing: Listing, known: FileTable, show_progress: bool) -> FoundFiles:
        """Whole columns at a time (numpy), so a million rows cost about as much as reading
        them; only the bad rows are looked at one by one, to say what is wrong with each."""
        c = self.config
        names = [c.filename_column, c.width_column, c.height_column]
        if self.wants_captions:
            names += [n for n in (c.caption_column, c.fallback_caption_column) if n]
        columns = read_columns(self.path, list(dict.fromkeys(names)))
        files_in_table = columns[c.filename_column]
        rows = len(files_in_table)
        count = len(listing.sample_ids)
        position = self._positions(listing, files_in_table)      # -1: not listed, -2: no name
        widths = _whole_pixels(columns[c.width_column])           # 0: not a usable size
        heights = _whole_pixels(columns[c.height_column])
        captions_of = self._captions(columns, rows)
        listed = position >= 0
        first_row = np.full(count, -1, dtype=np.int64)  # the first row naming each listed file
        named = np.flatnonzero(listed)[::-1]
        first_row[position[named]] = named
        duplicate = listed & (first_row[np.maximum(position, 0)] != np.arange(rows))
        usable = listed & ~duplicate & (widths > 0) & (heights > 0)
        if self.wants_captions:
            usable &= np.fromiter((t is not None for t in captions_of), bool, rows)
        table_widths = np.zeros(count, dtype=np.int64)
        table_heights = np.zeros(count, dtype=np.int64)
        table_widths[position[usable]] = widths[usable]
        table_heights[position[usable]] = heights[usable]
        files = FileTable(listing.sample_ids, listing.sizes, listing.change_keys,
                          table_widths.tolist(), table_heights.tolist())
        skipped = self._report_rows(np.flatnonzero(~usable), position, first_row, columns,
                                    captions_of, files)
        for row in np.flatnonzero(first_row < 0).tolist():
            files.errors[listing.sample_ids[row]] = f"no row in the metadata table {self.path}"
        captions = None
        if self.wants_captions:  # a column beside the listing's rows
            column = np.full(count, None, dtype=object)
            column[position[usable]] = np.array(captions_of, dtype=object)[usable]
            captions = column.tolist()
        return FoundFiles(files, 0, 0, skipped, captions)

    def _positions(self, listing: Listing, files_in_table: list) -> "np.ndarray":
        """Each row's position in the listing: -1 when the storage lacks it, -2 without a name."""
        ids = listing.sample_ids
        if self.config.identifier_includes_extension:
            by_name = dict(zip(ids, range(len(ids))))
        else:  # 'a/img' names 'a/img.png'; with two such files the first in id order wins
            by_name = {}
            for row, sample_id in enumerate(ids):
                by_name.setdefault(posixpath.splitext(sample_id)[0], row)

        # dict.get through map runs in C: the usual row (its exact sample id) costs no Python
        # call; the few rows it misses are looked at again below.
        try:
            found = np.fromiter(map(by_name.get, files_in_table, repeat(-1)), np.int64,
                                len(files_in_table))
        except TypeError:  # an unhashable name (a list in a JSONL line): one by one
            found = np.fromiter((by_name.get(n, -1) if isinstance(n, str) else -1
                                 for n in files_in_table), np.int64, len(files_in_table))
        for row in np.flatnonzero(found < 0).tolist():
            name = files_in_table[row]
            if not isinstance(name, str) or not name.strip("/"):
                found[row] = -2
            else:
                found[row] = by_name.get(name.lstrip("/"), -1)
        return found

    def _report_rows(self, bad_rows, position, first_row, columns, captions_of,
                     files: FileTable) -> list[SkippedFile]:
        """What is wrong with each unusable row; a listed file's own problem goes to its
        FileTable row (reported as a skip of that file), the others are skips of their own."""
        c = self.config
        skipped: list[SkippedFile] = []
        for row in bad_rows.tolist():
            where = f"{self.path} row {row}"
            name, at = columns[c.filename_column][row], int(position[row])
            if at == -2:
                skipped.append(SkippedFile(f"<row {row}>", f"{where}: {c.filename_column!r} is "
                                                           "empty, missing or not text"))
            elif at == -1:
                skipped.append(SkippedFile(name, f"{where}: no such image in "
                                                 f"{self.storage.location}"))
            elif first_row[at] != row:
                sample_id = files.ids[at]
                skipped.append(SkippedFile(sample_id, f"{where}: a second row for this file "
                                                      f"(first: row {first_row[at]}); ignored"))
            else:
                problem = self._row_problem(columns[c.width_column][row],
                                            columns[c.height_column][row], captions_of[row])
                files.errors[files.ids[at]] = f"{where}: {problem}"
        return skipped

    def _captions(self, columns: dict[str, list], count: int) -> list[str | None]:
        """Each row's caption: caption_column, else fallback_caption_column where empty."""
        c = self.config
        if not self.wants_captions:
            return [None] * count
        primary = columns[c.caption_column]
        fallback = columns[c.fallback_caption_column] if c.fallback_caption_column else primary
        return [p.strip() if isinstance(p, str) and p.strip() else
                (f.strip() if isinstance(f, str) and f.strip() else None)
                for p, f in zip(primary, fallback)]

    def _row_problem(self, width, height, caption) -> str | None:
        c = self.config
        if _positive_whole(width) is None or _positive_whole(height) is None:
            return (f"{c.width_column!r} x {c.height_column!r} is {width!r} x {height!r}; "
                    "expected positive whole numbers of pixels")
        if self.wants_captions and caption is None:
            fallback = f" and {c.fallback_caption_column!r}" if c.fallback_caption_column else ""
            return f"empty {c.caption_column!r}{fallback} (caption_strategy 'parquet')"
        return None
