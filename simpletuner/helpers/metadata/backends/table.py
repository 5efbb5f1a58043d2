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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simpletuner.common.cores import usable_cores
from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.backends.table_columns import (
    ArrowTexts, TableColumns, TableFormatError, arrow_strings, escaping_names, positive_whole,
    read_table,
)
from simpletuner.helpers.metadata.backends.table_lookup import (
    NOT_LISTED, positions_in, positions_in_sorted,
)
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.skipped import SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.text_column import TextColumn
from simpletuner.helpers.metadata.index_cache import (
    LoadedIndex, listing_columns, size_columns, table_caption_rows, table_caption_texts,
)
from simpletuner.helpers.metadata.index_columns import StringColumn
from simpletuner.helpers.metadata.index_file import ColumnFileWriter

__all__ = ["TableFormatError", "TableSource"]

NO_NAME = -2  # a row's position when it names no file (NOT_LISTED: not a listed one)


@dataclass(frozen=True)
class ListedColumns:
    """The listing's ids as the index cache stores them, and the names a table's rows are
    looked up in (the ids, or their stems), made while pyarrow reads the table."""

    id_column: StringColumn
    names: Any  # Arrow strings


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

    def unchanged(self, listing: Listing, cached: LoadedIndex) -> bool:
        """The cached index holds for ``listing``: same files as when it was built (the table's
        identity is in ``key``, so ``cached`` comes from this very table)."""
        return not listing.unreadable and cached.same_files(listing)

    def read(self, listing: Listing, known: FileTable, show_progress: bool,
             store: ColumnFileWriter | None = None) -> FoundFiles:
        """``store``: the index cache version being written, given the file table's columns
        and the captions' as each is known: the listing's while pyarrow reads, the captions'
        texts while the names are looked up."""
        with ThreadPoolExecutor(1) as reader:  # pyarrow reads without the GIL meanwhile
            reading = reader.submit(self._read_table)
            listed = self._listed(listing)
            if store is not None:
                store.add(listing_columns(listed.id_column, listing.sizes, listing.change_keys))
            table = reading.result()
        captions = None
        if self.wants_captions:  # in the table's order
            column = table.captions
            captions = ArrowTexts(column.chunk(0) if column.num_chunks == 1
                                  else column.combine_chunks())
            if store is not None:
                store.add(table_caption_texts(captions))
        files, row_of_file, skipped = self._files(listing, table, self._positions(table.names,
                                                                                  listed))
        count = len(files.ids)
        if captions is not None and not (len(captions) == count
                                         and np.array_equal(row_of_file, np.arange(count))):
            captions = ArrowTexts(captions.array, row_of_file)  # each file's row of the table
        if store is not None:
            store.add(size_columns(files))
            if captions is not None:
                store.add(table_caption_rows(captions))
        return FoundFiles(files, 0, 0, skipped, captions, listed.id_column, store is not None,
                          tabled=len(files.ids))

    def _read_table(self) -> TableColumns:
        c = self.config
        return read_table(self.path, c.filename_column, c.width_column, c.height_column,
                          [n for n in (c.caption_column, c.fallback_caption_column) if n]
                          if self.wants_captions else [])

    def _files(self, listing: Listing, table: TableColumns, position: np.ndarray
               ) -> tuple[FileTable, np.ndarray, SkippedFiles]:
        """(the listed files with the sizes of their rows, the usable row of each file (-1:
        none), the skips of rows that name no listed file)."""
        count = len(listing.sample_ids)
        first_row, duplicate = self._first_rows(position, count)
        usable = (position >= 0) & ~duplicate & (table.widths > 0) & (table.heights > 0)
        if self.wants_captions:
            usable &= table.captions.is_valid().to_numpy(zero_copy_only=False)
        row_of_file = np.full(count, -1, dtype=np.int64)
        row_of_file[position[usable]] = np.flatnonzero(usable)
        files = FileTable(listing.sample_ids, listing.sizes, listing.change_keys,
                          self._by_file(table.widths, row_of_file),
                          self._by_file(table.heights, row_of_file))
        skipped = self._report_rows(np.flatnonzero(~usable), position, first_row, table, files)
        for at in np.flatnonzero(first_row < 0).tolist():
            files.errors[listing.sample_ids[at]] = f"no row in the metadata table {self.path}"
        return files, row_of_file, skipped

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

    def _listed(self, listing: Listing) -> ListedColumns:
        import pyarrow

        id_column = StringColumn.encode(listing.sample_ids)
        if self.config.identifier_includes_extension:
            names = arrow_strings(id_column)
        else:  # 'a/img' names 'a/img.png'
            names = pyarrow.array([posixpath.splitext(i)[0] for i in listing.sample_ids],
                                  pyarrow.string())
        return ListedColumns(id_column, names)

    def _positions(self, names, listed: ListedColumns) -> np.ndarray:
        """Each row's position in the listing: NOT_LISTED, or NO_NAME without a file name."""
        import pyarrow
        import pyarrow.compute as pc

        if self.config.identifier_includes_extension:
            if names.equals(pyarrow.chunked_array([listed.names])):
                return np.arange(len(names), dtype=np.int64)  # a table in the listing's order
            look_up = positions_in_sorted  # the ids, sorted as a listing is
        else:  # stems: with two files of one stem, the first in id order wins
            look_up = positions_in
        found = look_up(names, listed.names, usable_cores())
        # '/a.png' names 'a.png'; '', '/' and non-text name nothing: only those looked at again
        # (not every name of a table written for a bigger folder)
        again = pc.fill_null(pc.or_(pc.starts_with(names, "/"), pc.equal(names, "")), True)
        missed = np.flatnonzero((found < 0) & again.to_numpy(zero_copy_only=False))
        if len(missed):
            stripped = pc.utf8_ltrim(names.take(pyarrow.array(missed)), characters="/")
            empty = pc.fill_null(pc.equal(pc.utf8_length(stripped), 0), True)
            found[missed] = np.where(empty.to_numpy(zero_copy_only=False), NO_NAME,
                                     look_up(stripped, listed.names, usable_cores()))
        return found

    def _report_rows(self, bad_rows, position, first_row, table: TableColumns,
                     files: FileTable) -> SkippedFiles:
        """What is wrong with each unusable row; a listed file's own problem goes to its
        FileTable row (reported as a skip of that file), the others are skips of their own."""
        import pyarrow.compute as pc

        c = self.config
        location = self.storage.location
        # The reasons of rows without a name or without a file do not repeat their row (the
        # sample names it), so a table of millions of absent rows is one reason, counted, and
        # their names go from the table's column to the skips' without a str per row.
        no_name = f"{self.path}: {c.filename_column!r} is empty, missing or not text"
        absent = f"{self.path}: no such image in {location}"
        escaping = f"{self.path}: a '..' in the name reaches outside {location}; not trained"
        unlisted = bad_rows[position[bad_rows] == NOT_LISTED]
        names = table.names.take(unlisted)
        escapes = escaping_names(names)
        skipped: list[SkippedFile] = [SkippedFile(name, escaping) for name in
                                      names.filter(escapes).to_pylist()]
        for row in bad_rows[position[bad_rows] != NOT_LISTED].tolist():
            where = f"{self.path} row {row}"
            at = int(position[row])
            if at == NO_NAME:
                skipped.append(SkippedFile(f"<row {row}>", no_name))
            elif first_row[at] != row:
                skipped.append(SkippedFile(files.ids[at], f"{where}: a second row for this file "
                                                          f"(first: row {first_row[at]}); ignored"))
            else:
                files.errors[files.ids[at]] = f"{where}: {self._row_problem(table, row)}"
        gone = TextColumn.from_arrow(names.filter(pc.invert(escapes)))
        return SkippedFiles.one_reason(gone, absent).joined(SkippedFiles.of(skipped))

    def _row_problem(self, table: TableColumns, row: int) -> str:
        c = self.config
        width = table.value_of(c.width_column, row)
        height = table.value_of(c.height_column, row)
        if positive_whole(width) is None or positive_whole(height) is None:
            return (f"{c.width_column!r} x {c.height_column!r} is {width!r} x {height!r}; "
                    "expected positive whole numbers of pixels")
        fallback = f" and {c.fallback_caption_column!r}" if c.fallback_caption_column else ""
        return f"empty {c.caption_column!r}{fallback} (caption_strategy 'parquet')"
