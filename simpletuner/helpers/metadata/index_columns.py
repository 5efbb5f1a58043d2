"""Views of the index cache's memory-mapped columns (index_cache.py): ids, sizes, captions;
the same views serve the file table a refresh has just built.

An id becomes a Python str only when it is asked for (the samples of a micro-batch, the trace,
a lookup by bisection), so a bucket of millions costs its row numbers, not millions of strings.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from simpletuner.helpers.metadata.index import SizesView
from simpletuner.helpers.metadata.split import SortedIds
from simpletuner.helpers.metadata.text_column import ENCODING as _ENCODING
from simpletuner.helpers.metadata.text_column import TextColumn

__all__ = ["ListColumn", "MappedCaptions", "MappedIds", "MappedSizes", "StringColumn",
           "TextColumn"]

_DECODED_AT_ONCE = 1 << 16  # ids decoded per step when iterating
_JOINED_AT_ONCE = 1 << 16  # ids encoded per step
_SCANNED_AT_ONCE = 1 << 22  # bytes scanned per step: temporaries that stay small


class StringColumn:
    """Strings stored as one blob, each followed by a NUL, and the offsets of their starts."""

    def __init__(self, blob: np.ndarray, starts: np.ndarray):
        self.blob, self.starts = blob, starts  # starts: one per string, then the blob's end
        self._json_plain: bool | None = None  # known once asked

    @classmethod
    def encode(cls, texts: Sequence[str]) -> "StringColumn":
        # a slice at a time, so a thread beside this one gets the GIL between slices; each
        # slice joined with an empty last string, so each string is followed by a NUL
        blob = b"".join("\0".join([*texts[first:first + _JOINED_AT_ONCE], ""]).encode(*_ENCODING)
                        for first in range(0, len(texts), _JOINED_AT_ONCE))
        data = np.frombuffer(blob, dtype=np.uint8)
        starts = np.zeros(len(texts) + 1, np.int64)
        found = 0
        for first in range(0, len(data), _SCANNED_AT_ONCE):  # small temporaries, reused
            ends = np.flatnonzero(data[first:first + _SCANNED_AT_ONCE] == 0) + (first + 1)
            if found + len(ends) > len(texts):
                break
            starts[found + 1:found + 1 + len(ends)] = ends
            found += len(ends)
        if found != len(texts) or (len(texts) and starts[-1] != len(data)):
            raise ValueError("a string holds a NUL character, which this column cannot store")
        return cls(data, starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def at(self, row: int) -> str:
        return self.blob[self.starts[row]:self.starts[row + 1] - 1].tobytes().decode(*_ENCODING)

    def plain_joined(self, rows: np.ndarray | None, separator: bytes) -> bytes | None:
        """The strings of ``rows`` (None: all) joined by ``separator``, gathered by pyarrow's
        take (a numpy gather of bytes is no faster than joining the strs); None without
        pyarrow, or when some string of the column is not printable ASCII without a quote or
        a backslash (it needs escaping in JSON)."""
        try:
            import pyarrow
        except ImportError:
            return None
        if not self._plain_for_json():
            return None
        strings = pyarrow.LargeBinaryArray.from_buffers(  # each string with its NUL
            pyarrow.large_binary(), len(self),
            [None, pyarrow.py_buffer(self.starts), pyarrow.py_buffer(self.blob)])
        taken = strings if rows is None else strings.take(pyarrow.array(rows, pyarrow.int64()))
        offsets = np.frombuffer(taken.buffers()[1], np.int64)[:len(taken) + 1]
        data = np.frombuffer(taken.buffers()[2], np.uint8) if len(taken) else self.blob[:0]
        return data[offsets[0]:offsets[-1] - 1].tobytes().replace(b"\0", separator)

    def _plain_for_json(self) -> bool:
        if self._json_plain is None:
            controls, plain = 0, True
            for first in range(0, len(self.blob), _SCANNED_AT_ONCE):
                part = self.blob[first:first + _SCANNED_AT_ONCE]
                controls += int(np.count_nonzero(part < 0x20))
                plain = part.max() < 0x7F and not np.any((part == ord('"')) | (part == ord("\\")))
                if not plain:
                    break
            self._json_plain = bool(plain and controls == len(self))  # the NULs after strings
        return self._json_plain

    def iterate(self, rows: np.ndarray | None) -> Iterator[str]:
        """The strings of ``rows`` (None: all) in order, decoded a slice at a time (chained in
        C: a generator resumed per string was most of the cost of hashing a bucket)."""
        count = len(self) if rows is None else len(rows)
        return chain.from_iterable(
            self.many(np.arange(start, min(start + _DECODED_AT_ONCE, count)) if rows is None
                      else rows[start:start + _DECODED_AT_ONCE])
            for start in range(0, count, _DECODED_AT_ONCE))

    def many(self, rows: np.ndarray) -> list[str]:
        """The strings of ``rows``, decoded together: one gather of their bytes, one decode."""
        starts, ends = self.starts[rows], self.starts[rows + 1]
        lengths = ends - starts
        if not len(rows):
            return []
        shift = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        gathered = self.blob[np.arange(int(lengths.sum()), dtype=np.int64) + shift]
        return gathered.tobytes().decode(*_ENCODING).split("\0")[:-1]


class ListColumn:
    """A list of str read as a column (the ids of a file table just built)."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def at(self, row: int) -> str:
        return self.texts[row]

    def many(self, rows: np.ndarray) -> list[str]:
        return list(self.iterate(rows))

    def iterate(self, rows: np.ndarray | None) -> Iterator[str]:
        return iter(self.texts) if rows is None else map(self.texts.__getitem__, rows.tolist())

    def plain_joined(self, rows: np.ndarray | None, separator: bytes) -> None:
        return None  # joining the strs is the fastest way here


class MappedIds(SortedIds):
    """A bucket's ids as rows of an id column (the mapped cache's, or the file table's just
    built): the same Sequence of str, decoded on access. ``rows`` None: every row."""

    def __init__(self, column: StringColumn | ListColumn, rows: np.ndarray | None = None):
        self.column, self._rows = column, rows

    def __len__(self) -> int:
        return len(self.column) if self._rows is None else len(self._rows)

    def _row(self, at: int) -> int:
        if not -len(self) <= at < len(self):
            raise IndexError("sample id index out of range")
        at %= len(self)
        return at if self._rows is None else int(self._rows[at])

    def __getitem__(self, at):
        if isinstance(at, slice):
            return self.column.many(self.rows_of(np.arange(len(self))[at]))
        return self.column.at(self._row(at))

    def rows_of(self, positions: np.ndarray) -> np.ndarray:
        """The column's rows at these positions of the bucket."""
        return positions if self._rows is None else np.asarray(self._rows[positions], np.int64)

    def __iter__(self) -> Iterator[str]:
        return self.column.iterate(self._rows)

    def plain_joined(self, separator: bytes) -> bytes | None:
        return self.column.plain_joined(self._rows, separator)

    def without(self, removed: Mapping[str, object]) -> SortedIds:
        gone = [at for at in (bisect_left(self, s) for s in removed)
                if at < len(self) and self[at] in removed]
        rows = self.rows_of(np.arange(len(self)))
        return MappedIds(self.column, np.delete(rows, gone))


class MappedSizes(SizesView):
    """(width, height) of the usable rows (width > 0) not in ``excluded``, by bisection."""

    def __init__(self, ids: MappedIds, widths: np.ndarray, heights: np.ndarray,
                 excluded: frozenset[str]):
        self._ids, self._widths, self._heights, self._excluded = ids, widths, heights, excluded

    def _row(self, sample_id: str) -> int | None:
        row = bisect_left(self._ids, sample_id)
        if row == len(self._ids) or self._ids[row] != sample_id:
            return None
        return row

    def __getitem__(self, sample_id: str) -> tuple[int, int]:
        row = self._row(sample_id)
        if row is None or not self._widths[row] or sample_id in self._excluded:
            raise KeyError(sample_id)
        return int(self._widths[row]), int(self._heights[row])

    def __iter__(self) -> Iterator[str]:
        usable = MappedIds(self._ids.column, np.flatnonzero(self._widths > 0))
        return (s for s in usable if s not in self._excluded)

    def __len__(self) -> int:
        excluded_usable = sum(1 for s in self._excluded
                              if (row := self._row(s)) is not None and self._widths[row])
        return int(np.count_nonzero(self._widths)) - excluded_usable

    def without(self, removed: Mapping[str, str]) -> "MappedSizes":
        return MappedSizes(self._ids, self._widths, self._heights,
                           self._excluded | frozenset(removed))


@dataclass(frozen=True)
class MappedCaptions:
    """The captions the index keeps (CaptionTable's ``text_of``), decoded per lookup."""

    ids: MappedIds
    texts: TextColumn
    known: np.ndarray  # bool per row: False where no caption is kept
    rows: np.ndarray | None = None  # the text of each row (None: the row's own)

    def text_of(self, sample_id: str) -> str | None:
        row = bisect_left(self.ids, sample_id)
        if row == len(self.ids) or self.ids[row] != sample_id or not self.known[row]:
            return None
        return self.text_at(row)

    def text_at(self, row: int) -> str:
        return self.texts.at(row if self.rows is None else int(self.rows[row]))
