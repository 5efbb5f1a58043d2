"""What each file's header said, as parallel columns: the file table of the index cache.

A row is valid while the file's byte size and change key (local: mtime_ns; S3: ETag) are
unchanged. Columns instead of a record per file are what the cache stores (index_cache.py) and
leave nothing for the garbage collector to walk (benchmarks/PERFORMANCE.md, bench_discovery.py).
"""

from __future__ import annotations

import operator
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Iterator

import numpy as np

from simpletuner.helpers.data_backend.storage import ChangeKey, Listing
from simpletuner.helpers.metadata.backends.discovery import ClipProbe, Probe
from simpletuner.helpers.metadata.index import SizesView

# a clip table's columns besides the image ones (ClipProbe's fields); an image table has none
CLIP_COLUMNS = ("frames", "fps", "counted_by")
_UNKNOWN = {"frames": 0, "fps": "", "counted_by": ""}


def ascending_strings(ids: list) -> bool:
    """A C loop (~0.06 s per 1 M ids): the table's order is the canonical order the split
    relies on, and a rank trusts the digest recorded with it (index_cache.py)."""
    if ids and not isinstance(ids[0], str):
        return False
    try:  # a str compared with anything else raises
        return all(map(operator.lt, ids, islice(ids, 1, None)))
    except TypeError:
        return False


class FileTableFormatError(ValueError):
    """The cached columns are not a table this code would write."""


@dataclass
class FileTable:
    """Rows sorted by sample id. A row whose header could not be used has width and height 0
    and its reason in ``errors``."""

    ids: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)      # bytes
    change_keys: list[ChangeKey] = field(default_factory=list)
    # EXIF-oriented; a list, or a table's numpy column (no int object per row)
    widths: list[int] | np.ndarray = field(default_factory=list)
    heights: list[int] | np.ndarray = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # sample id -> why it is skipped
    clips: dict[str, list] | None = None  # a clip table's CLIP_COLUMNS; None for images

    @classmethod
    def for_clips(cls) -> "FileTable":
        return cls(clips={name: [] for name in CLIP_COLUMNS})

    def reconcile(self, listing: Listing) -> tuple["FileTable", list[int], int]:
        """(rows for the listed files, positions whose header must be read, rows forgotten).

        Rows of unchanged files are carried over; the others get width 0 until
        ``record`` fills them in.
        """
        ids, sizes, keys = listing.sample_ids, listing.sizes, listing.change_keys
        if ids == self.ids and sizes == self.sizes and keys == self.change_keys:
            return self, [], 0  # nothing changed: the usual start, three list comparisons
        position = dict(zip(self.ids, range(len(self.ids))))
        table = FileTable(list(ids), list(sizes), list(keys),
                          clips=None if self.clips is None else {n: [] for n in CLIP_COLUMNS})
        stale: list[int] = []
        still_there = 0
        for row, (sample_id, size, key) in enumerate(zip(ids, sizes, keys)):
            old = position.get(sample_id)
            still_there += old is not None
            if old is not None and self.sizes[old] == size and self.change_keys[old] == key:
                table.widths.append(self.widths[old])
                table.heights.append(self.heights[old])
                for name, column in (table.clips or {}).items():
                    column.append(self.clips[name][old])
                if sample_id in self.errors:
                    table.errors[sample_id] = self.errors[sample_id]
            else:
                table.widths.append(0)
                table.heights.append(0)
                for name, column in (table.clips or {}).items():
                    column.append(_UNKNOWN[name])
                stale.append(row)
        return table, stale, len(self.ids) - still_there

    def record(self, row: int, probe: Probe | ClipProbe) -> None:
        """Store what the header (or a clip table: the container) of the file in ``row`` said."""
        sample_id = self.ids[row]
        self.errors.pop(sample_id, None)
        if probe.error:
            self.widths[row] = self.heights[row] = 0
            self.errors[sample_id] = probe.error
        else:
            self.widths[row], self.heights[row] = probe.width, probe.height
        for name, column in (self.clips or {}).items():
            column[row] = _UNKNOWN[name] if probe.error else getattr(probe, name)

    def row_of(self, sample_id: str) -> int:
        """The row of a sample id the table holds (bisect: the ids are sorted)."""
        row = bisect_left(self.ids, sample_id)
        if row == len(self.ids) or self.ids[row] != sample_id:
            raise KeyError(sample_id)
        return row

    def image_sizes(self, excluded: set[str]) -> "ImageSizes":
        """(width, height) by sample id of the usable rows not in ``excluded``."""
        return ImageSizes(self, excluded)


class ImageSizes(SizesView):
    """A read-only view of a FileTable's sizes: looked up in the sorted id column (bisect)."""

    def __init__(self, table: FileTable, excluded: set[str]):
        self._table = table
        self._excluded = excluded

    def __getitem__(self, sample_id: str) -> tuple[int, int]:
        ids = self._table.ids
        row = bisect_left(ids, sample_id)
        if (row == len(ids) or ids[row] != sample_id or not self._table.widths[row]
                or sample_id in self._excluded):
            raise KeyError(sample_id)
        return int(self._table.widths[row]), int(self._table.heights[row])

    def __iter__(self) -> Iterator[str]:
        return (sample_id for sample_id, width in zip(self._table.ids, self._table.widths)
                if width and sample_id not in self._excluded)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def without(self, removed: Mapping[str, str]) -> "ImageSizes":
        return ImageSizes(self._table, self._excluded | set(removed))
