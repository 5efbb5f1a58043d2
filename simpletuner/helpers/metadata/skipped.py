"""The files a dataset's index leaves out, and why, as columns.

A table naming millions of files that are not there skips millions of rows, nearly all for one
reason. ``SkippedFiles`` holds them as the index cache stores them: the paths one after the
other in one blob with the offsets of their starts and its end (TextColumn, Arrow's layout:
any character, a name that is not UTF-8 too), the reasons once each and an int32 code per
skip, so a start-up, ``plan`` and the report count them by reason without a Python object per
skip. Code that looks at a few reads it as a Sequence of SkippedFile.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from simpletuner.helpers.metadata.text_column import ENCODING as _ENCODING
from simpletuner.helpers.metadata.text_column import TextColumn

_DECODED_AT_ONCE = 1 << 16  # skips decoded per step when iterating


@dataclass(frozen=True, slots=True)  # slots: a dataset may skip millions of rows
class SkippedFile:
    path: str    # sample id (path relative to the dataset root, '/' separators)
    reason: str  # human-readable, e.g. "truncated or unreadable header"


class SkippedFiles(Sequence):
    """Skips in order: ``paths``, ``reasons`` (distinct texts) and ``codes`` (the index in
    ``reasons`` of each skip's)."""

    def __init__(self, paths: TextColumn, reasons: Sequence[str], codes: np.ndarray):
        if len(codes) != len(paths) or (len(codes) and not 0 <= codes.min() <= codes.max()
                                        < len(reasons)):
            raise ValueError("the skips' reason codes do not match their paths and reasons")
        self.paths, self.reasons, self.codes = paths, list(reasons), codes

    @classmethod
    def of(cls, skips: Iterable[SkippedFile] | "SkippedFiles") -> "SkippedFiles":
        """``skips`` as columns (a SkippedFiles as it is)."""
        if isinstance(skips, SkippedFiles):
            return skips
        skips = list(skips)
        reasons = list(dict.fromkeys(s.reason for s in skips))
        number = {reason: n for n, reason in enumerate(reasons)}
        return cls(TextColumn.encode([s.path for s in skips]), reasons,
                   np.array([number[s.reason] for s in skips], np.int32))

    @classmethod
    def one_reason(cls, paths: TextColumn, reason: str) -> "SkippedFiles":
        """Every path in ``paths`` skipped for ``reason``."""
        return cls(paths, [reason] if len(paths) else [], np.zeros(len(paths), np.int32))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, at):
        if isinstance(at, slice):
            return [self[n] for n in range(*at.indices(len(self)))]
        if not -len(self) <= at < len(self):
            raise IndexError("skip index out of range")
        at %= len(self)
        return SkippedFile(self.paths.at(at), self.reasons[int(self.codes[at])])

    def __iter__(self) -> Iterator[SkippedFile]:
        for first in range(0, len(self), _DECODED_AT_ONCE):
            last = min(first + _DECODED_AT_ONCE, len(self))
            reasons = [self.reasons[code] for code in self.codes[first:last].tolist()]
            yield from map(SkippedFile, self.path_slice(first, last), reasons)

    def __eq__(self, other) -> bool:
        if isinstance(other, (SkippedFiles, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def path_slice(self, first: int, last: int) -> list[str]:
        """The paths of skips ``first`` to ``last``: their bytes copied once, cut, decoded."""
        starts = self.paths.starts[first:last + 1]
        data = self.paths.blob[starts[0]:starts[-1]].tobytes() if last > first else b""
        bounds = (starts - starts[0]).tolist()
        return [data[a:b].decode(*_ENCODING) for a, b in zip(bounds, bounds[1:])]

    def __add__(self, other: Iterable[SkippedFile]) -> "SkippedFiles":
        return self.joined(SkippedFiles.of(other))

    def joined(self, other: "SkippedFiles") -> "SkippedFiles":
        """These skips, then ``other``'s (either, when the other has none: no copy)."""
        if not len(self):
            return other
        if not len(other):
            return self
        reasons = list(dict.fromkeys([*self.reasons, *other.reasons]))
        number = {reason: n for n, reason in enumerate(reasons)}
        recode = np.array([number[reason] for reason in other.reasons], np.int32)
        blob = np.concatenate([self.paths.blob, other.paths.blob])
        starts = np.concatenate([self.paths.starts[:-1],
                                 other.paths.starts + self.paths.starts[-1]])
        codes = np.concatenate([self.codes, recode[other.codes]]).astype(np.int32)
        return SkippedFiles(TextColumn(blob, starts), reasons, codes)

    def counts(self) -> dict[str, int]:
        """Reason -> how many skips give it (reasons given by none left out)."""
        counted = np.bincount(self.codes, minlength=len(self.reasons)).tolist()
        return {reason: n for reason, n in zip(self.reasons, counted) if n}

    def summary(self, limit: int) -> dict[str, dict]:
        """Reason -> {"count": skips giving it, "first": the first ``limit`` paths, in order}
        (one stable sort of the codes: no pass per reason)."""
        order = np.argsort(self.codes, kind="stable")
        ends = np.cumsum(np.bincount(self.codes, minlength=len(self.reasons))).tolist()
        summary, start = {}, 0
        for reason, end in zip(self.reasons, ends):
            if end > start:
                first = order[start:min(end, start + limit)].tolist()
                summary[reason] = {"count": end - start,
                                   "first": [self.paths.at(row) for row in first]}
            start = end
        return summary

    def sorted(self) -> "SkippedFiles":
        """Ordered by path, then reason (as a list of them sorts): by pyarrow where it is
        installed, the paths as bytes (UTF-8 orders as code points do, lone surrogates too)."""
        try:
            import pyarrow
            import pyarrow.compute as pc
        except ImportError:
            return SkippedFiles.of(sorted(self, key=lambda s: (s.path, s.reason)))
        rank = np.argsort(np.argsort(np.array(self.reasons, dtype=object), kind="stable"))
        ranks = rank.astype(np.int32)[self.codes] if len(self.reasons) else self.codes
        paths = self._arrow_paths()
        order = pc.sort_indices(pyarrow.table({"path": paths, "rank": ranks}),
                                [("path", "ascending"), ("rank", "ascending")])
        return SkippedFiles(TextColumn.from_arrow(paths.take(order)),  # no index per byte
                            self.reasons, self.codes[order.to_numpy(zero_copy_only=False)])

    def _arrow_paths(self):
        import pyarrow

        return pyarrow.Array.from_buffers(
            pyarrow.large_binary(), len(self.paths),
            [None, pyarrow.py_buffer(np.ascontiguousarray(self.paths.starts)),
             pyarrow.py_buffer(np.ascontiguousarray(self.paths.blob))])

    def among(self, ids: Sequence[str]) -> frozenset[str]:
        """The skipped paths the sizes of ``ids`` (a dataset's listed files) leave out: all of
        them when they are fewer than ``ids``, else (a table naming millions of files that are
        not there) those in ``ids``, found without a str per skip."""
        if len(self) <= len(ids):
            return frozenset(s.path for s in self)
        try:
            import pyarrow
            import pyarrow.compute as pc
        except ImportError:
            listed = set(ids)
            return frozenset(s.path for s in self if s.path in listed)
        listed = pyarrow.array([s.encode(*_ENCODING) for s in ids], pyarrow.large_binary())
        rows = np.flatnonzero(pc.is_in(self._arrow_paths(), value_set=listed)
                              .to_numpy(zero_copy_only=False))
        return frozenset(self.paths.at(row) for row in rows.tolist())

    def entries(self) -> "Entries":
        """The skips as skipped_files.json lists them, ``{"path", "reason"}`` each."""
        return Entries(self)

    def columns(self) -> dict[str, np.ndarray]:
        """As the index cache stores them (the reasons go in its header)."""
        return {"skipped_path_bytes": self.paths.blob, "skipped_path_starts": self.paths.starts,
                "skipped_codes": self.codes}

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray], reasons: list[str]) -> "SkippedFiles":
        """The skips of an index cache (ValueError where they do not fit together)."""
        paths = TextColumn(columns["skipped_path_bytes"], columns["skipped_path_starts"])
        starts = paths.starts
        if len(starts) < 1 or starts[0] != 0 or starts[-1] != len(paths.blob) or np.any(
                np.diff(starts) < 0):
            raise ValueError("the skipped paths' starts do not partition their bytes")
        if not all(isinstance(reason, str) for reason in reasons):
            raise ValueError("a skip reason is not text")
        return cls(paths, reasons, columns["skipped_codes"])


class Entries(Sequence):
    """A SkippedFiles read as ``{"path", "reason"}`` dicts, a slice at a time (what
    common/atomic.py's JSON writer takes for a long list: never all of them at once)."""

    def __init__(self, skipped: SkippedFiles):
        self.skipped = skipped

    def __len__(self) -> int:
        return len(self.skipped)

    def __getitem__(self, at):
        if not isinstance(at, slice):
            if not -len(self) <= at < len(self):
                raise IndexError("skip index out of range")
            at %= len(self)
            return self[at:at + 1][0]
        first, last, step = at.indices(len(self))
        last = max(first, last)
        codes = self.skipped.codes[first:last].tolist()
        entries = [{"path": path, "reason": self.skipped.reasons[code]}
                   for path, code in zip(self.skipped.path_slice(first, last), codes)]
        return entries[::step]
