"""Metadata backend 'parquet': image sizes (and captions) from a table, no image opened.

SimpleTuner's ``parquet`` block names the table (.parquet, or .jsonl with one object a line)
and its columns. Each row names a file in the storage; a row that cannot be used is reported
with its row number and what is wrong, and skipped: an empty file name, a size that is not a
positive whole number, a file the storage does not hold, a second row for the same file, no
caption for caption_strategy 'parquet'. Listed images without a row are reported too. The
result is the same FileTable header probes give, so the index is the one discovery builds.

Every check runs on whole columns (Arrow, numpy): a million rows cost a few times what
reading them costs, and the captions stay in one Arrow buffer instead of a million strings.
"""

from __future__ import annotations

import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simpletuner.common.cores import usable_cores
from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.backends.table_columns import (
    ArrowTexts, TableColumns, TableFormatError, arrow_strings, positive_whole, read_table,
    same_strings,
)
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import SkippedFile
from simpletuner.helpers.metadata.index_columns import StringColumn

if TYPE_CHECKING:
    from simpletuner.helpers.metadata.index_cache import LoadedIndex

__all__ = ["TableFormatError", "TableSource"]

NOT_LISTED, NO_NAME = -1, -2  # a row's position when it names no listed file
NAMES_PER_LOOKUP_PART = 1 << 16  # a smaller listing is looked up in one part, by one thread


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
                            c.identifier_includes_extension, c.trust_table]}

    def unchanged(self, listing: Listing, cached: "LoadedIndex") -> bool:
        """The cached index holds for ``listing``: same files as when it was built (the table's
        identity is in ``key``, so ``cached`` comes from this very table)."""
        return not listing.unreadable and cached.same_files(listing)

    def read(self, listing: Listing, known: FileTable, show_progress: bool) -> FoundFiles:
        c = self.config
        caption_columns = ([n for n in (c.caption_column, c.fallback_caption_column) if n]
                           if self.wants_captions else [])
        with ThreadPoolExecutor(1) as encoder:  # the ids encoded while pyarrow reads
            encoding = encoder.submit(StringColumn.encode, listing.sample_ids)
            table = read_table(self.path, c.filename_column, c.width_column, c.height_column,
                               caption_columns)
            id_column = encoding.result()
        position = self._positions(listing, table.names, id_column)
        count = len(listing.sample_ids)
        first_row, duplicate = self._first_rows(position, count)
        usable = (position >= 0) & ~duplicate & (table.widths > 0) & (table.heights > 0)
        if self.wants_captions:
            usable &= table.captions.is_valid().to_numpy(zero_copy_only=False)
        row_of_file = np.full(count, -1, dtype=np.int64)  # the usable row of each listed file
        row_of_file[position[usable]] = np.flatnonzero(usable)
        files = FileTable(listing.sample_ids, listing.sizes, listing.change_keys,
                          self._by_file(table.widths, row_of_file),
                          self._by_file(table.heights, row_of_file))
        skipped = self._report_rows(np.flatnonzero(~usable), position, first_row, table, files)
        for at in np.flatnonzero(first_row < 0).tolist():
            files.errors[listing.sample_ids[at]] = f"no row in the metadata table {self.path}"
        captions = None
        if self.wants_captions:  # a column beside the listing's rows
            import pyarrow

            column = table.captions
            if not np.array_equal(row_of_file, np.arange(count)):  # else: in the listing's order
                column = column.take(pyarrow.array(row_of_file, mask=row_of_file < 0))
            captions = ArrowTexts(column.chunk(0) if column.num_chunks == 1
                                  else column.combine_chunks())
        return FoundFiles(files, 0, 0, skipped, captions, id_column)

    @staticmethod
    def _by_file(values: np.ndarray, row_of_file: np.ndarray) -> np.ndarray:
        """A row-order column in listing order, 0 for files without a usable row."""
        return np.where(row_of_file >= 0, values[np.maximum(row_of_file, 0)], 0)

    @staticmethod
    def _first_rows(position: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(the first row naming each of ``count`` listed files, -1 if none; whether a row names
        a file an earlier row named). A table in the listing's order needs neither worked out."""
        rows = np.arange(len(position))
        if len(position) == count and np.array_equal(position, rows):
            return rows, np.zeros(len(position), bool)
        first_row = np.full(count, -1, dtype=np.int64)
        named = np.flatnonzero(position >= 0)[::-1]
        first_row[position[named]] = named  # the last write, of the first row, wins
        return first_row, (position >= 0) & (first_row[np.maximum(position, 0)] != rows)

    def _positions(self, listing: Listing, names, id_column: StringColumn) -> np.ndarray:
        """Each row's position in the listing: NOT_LISTED, or NO_NAME without a file name."""
        import pyarrow
        import pyarrow.compute as pc

        ids = listing.sample_ids
        whole = self.config.identifier_includes_extension
        if whole:
            if same_strings(names, id_column):
                return np.arange(len(ids), dtype=np.int64)  # a table in the listing's order
            known = arrow_strings(id_column)  # sorted, as a listing is
        else:  # 'a/img' names 'a/img.png'; with two such files the first in id order wins
            known = pyarrow.array([posixpath.splitext(i)[0] for i in ids], pyarrow.string())
        parts = max(1, min(usable_cores(), len(known) // NAMES_PER_LOOKUP_PART))
        found = self._lookup(names, known, parts, known_sorted=whole)
        missed = np.flatnonzero(found < 0)
        if len(missed):  # '/a.png' names 'a.png'; '', '/' and non-text name nothing
            stripped = pc.utf8_ltrim(names.take(pyarrow.array(missed)), characters="/")
            empty = pc.fill_null(pc.equal(pc.utf8_length(stripped), 0), True)
            found[missed] = np.where(empty.to_numpy(zero_copy_only=False), NO_NAME,
                                     self._lookup(stripped, known, parts, whole))
        return found

    @staticmethod
    def _lookup(names, known, parts: int, known_sorted: bool) -> np.ndarray:
        """The first position of each name in ``known``, else NOT_LISTED. ``known`` is cut into
        ``parts``, each hashed and probed by its own thread (pyarrow's index_in releases the
        GIL); when ``known`` is sorted, each part is probed only with the names in its range."""
        import pyarrow
        import pyarrow.compute as pc

        step = max(1, -(-len(known) // parts))
        firsts = range(0, max(len(known), 1), step)
        routed = known_sorted and len(firsts) > 1
        if routed:  # Arrow orders strings by their bytes, the listing's (code point) order
            part_of = sum(pc.fill_null(pc.greater_equal(names, known[first]), False)
                          .to_numpy(zero_copy_only=False).astype(np.int64)
                          for first in firsts[1:])

        def look_up(part: int, first: int) -> tuple[np.ndarray | None, np.ndarray]:
            rows = np.flatnonzero(part_of == part) if routed else None
            probed = names if rows is None else names.take(pyarrow.array(rows))
            found = pc.index_in(probed, value_set=known.slice(first, step)).cast("int64")
            return rows, pc.fill_null(pc.add(found, first), NOT_LISTED).to_numpy(
                zero_copy_only=False)

        found = np.full(len(names), NOT_LISTED, np.int64)
        with ThreadPoolExecutor(len(firsts)) as pool:
            for rows, in_part in pool.map(look_up, range(len(firsts)), firsts):
                if rows is not None:
                    found[rows] = in_part
                else:  # in order: the first position wins
                    found = np.where(found < 0, in_part, found)
        return found

    def _report_rows(self, bad_rows, position, first_row, table: TableColumns,
                     files: FileTable) -> list[SkippedFile]:
        """What is wrong with each unusable row; a listed file's own problem goes to its
        FileTable row (reported as a skip of that file), the others are skips of their own."""
        c = self.config
        skipped: list[SkippedFile] = []
        for row in bad_rows.tolist():
            where = f"{self.path} row {row}"
            at = int(position[row])
            if at == NO_NAME:
                skipped.append(SkippedFile(f"<row {row}>", f"{where}: {c.filename_column!r} is "
                                                           "empty, missing or not text"))
            elif at == NOT_LISTED:
                skipped.append(SkippedFile(table.value_of(c.filename_column, row),
                                           f"{where}: no such image in {self.storage.location}"))
            elif first_row[at] != row:
                skipped.append(SkippedFile(files.ids[at], f"{where}: a second row for this file "
                                                          f"(first: row {first_row[at]}); ignored"))
            else:
                files.errors[files.ids[at]] = f"{where}: {self._row_problem(table, row)}"
        return skipped

    def _row_problem(self, table: TableColumns, row: int) -> str:
        c = self.config
        width = table.value_of(c.width_column, row)
        height = table.value_of(c.height_column, row)
        if positive_whole(width) is None or positive_whole(height) is None:
            return (f"{c.width_column!r} x {c.height_column!r} is {width!r} x {height!r}; "
                    "expected positive whole numbers of pixels")
        fallback = f" and {c.fallback_caption_column!r}" if c.fallback_caption_column else ""
        return f"empty {c.caption_column!r}{fallback} (caption_strategy 'parquet')"
