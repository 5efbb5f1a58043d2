"""What each file's header said, as parallel columns: the ``files`` part of the metadata cache.

A row is valid while the file's byte size and mtime_ns are unchanged. Columns instead of a record
per file keep a warm start of a large dataset cheap: the JSON holds a few long lists of strings
and ints, which parse about 3x faster than a list per file and leave nothing for the garbage
collector to walk (benchmarks/bench_discovery.py measures it).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Iterable

from simpletuner.helpers.data_backend.local import Listing
from simpletuner.helpers.metadata.backends.discovery import Probe
from simpletuner.helpers.metadata.split import SortedIds

_COLUMNS = ("ids", "bytes", "mtime_ns", "width", "height")


class FileTableFormatError(ValueError):
    """The cached columns are not a table this code wrote."""


@dataclass
class FileTable:
    """Rows sorted by sample id. A row whose header could not be used has width and height 0
    and its reason in ``errors``."""

    ids: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)      # bytes
    mtimes_ns: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)     # EXIF-oriented
    heights: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # sample id -> why it is skipped

    def to_json(self) -> dict[str, Any]:
        return {"ids": self.ids, "bytes": self.sizes, "mtime_ns": self.mtimes_ns,
                "width": self.widths, "height": self.heights, "errors": self.errors}

    @classmethod
    def from_json(cls, data: Any) -> "FileTable":
        if not isinstance(data, dict) or not isinstance(data.get("errors"), dict):
            raise FileTableFormatError("'files' is not a table of columns")
        columns = [data.get(name) for name in _COLUMNS]
        if not all(isinstance(column, list) for column in columns):
            raise FileTableFormatError(f"'files' lacks one of the columns {', '.join(_COLUMNS)}")
        if len({len(column) for column in columns}) != 1:
            raise FileTableFormatError("the columns of 'files' differ in length")
        return cls(*columns, data["errors"])

    def reconcile(self, listing: Listing) -> tuple["FileTable", list[int], int]:
        """(rows for the listed files, positions whose header must be read, rows forgotten).

        Rows of unchanged files are carried over; the others get width 0 until
        ``record`` fills them in.
        """
        ids, sizes, mtimes = listing.sample_ids, listing.sizes, listing.mtimes_ns
        if ids == self.ids and sizes == self.sizes and mtimes == self.mtimes_ns:
            return self, [], 0  # nothing changed: the usual start, three list comparisons
        position = dict(zip(self.ids, range(len(self.ids))))
        table = FileTable(list(ids), list(sizes), list(mtimes))
        stale: list[int] = []
        still_there = 0
        for row, (sample_id, size, mtime) in enumerate(zip(ids, sizes, mtimes)):
            old = position.get(sample_id)
            still_there += old is not None
            if old is not None and self.sizes[old] == size and self.mtimes_ns[old] == mtime:
                table.widths.append(self.widths[old])
                table.heights.append(self.heights[old])
                if sample_id in self.errors:
                    table.errors[sample_id] = self.errors[sample_id]
            else:
                table.widths.append(0)
                table.heights.append(0)
                stale.append(row)
        return table, stale, len(self.ids) - still_there

    def record(self, row: int, probe: Probe) -> None:
        """Store what the header of the file in ``row`` said."""
        sample_id = self.ids[row]
        self.errors.pop(sample_id, None)
        if probe.error:
            self.widths[row] = self.heights[row] = 0
            self.errors[sample_id] = probe.error
        else:
            self.widths[row], self.heights[row] = probe.width, probe.height

    def ids_at(self, rows: list[int]) -> SortedIds:
        """The sample ids of ``rows``, which must ascend: the table is sorted by sample id, so
        they come out in canonical order without comparing a single id."""
        if rows and not (0 <= rows[0] and rows[-1] < len(self.ids)
                         and all(map(operator.lt, rows, islice(rows, 1, None)))):
            raise FileTableFormatError("a bucket's rows are not ascending rows of 'files'")
        return SortedIds(map(self.ids.__getitem__, rows))

    def sizes_without(self, skipped: Iterable[str]) -> dict[str, tuple[int, int]]:
        """(width, height) by sample id of every row but ``skipped`` (which holds the unusable
        ones). Dropping the few skipped is cheaper than picking the many kept."""
        sizes = dict(zip(self.ids, zip(self.widths, self.heights)))
        for sample_id in skipped:
            sizes.pop(sample_id, None)
        return sizes
