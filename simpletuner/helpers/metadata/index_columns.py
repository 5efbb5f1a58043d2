"""The bucket index as memory-mapped columns: what every rank loads at start-up.

The main process writes ``<cache>/metadata/<dataset id>.index`` (index_file.py) beside the JSON
cache: the sorted ids as one UTF-8 blob (each id followed by a NUL, which no file name holds)
with offsets, the widths and heights, each bucket as ascending rows of that table, the captions
the index keeps, and in the header the settings, skips and digests. A rank maps it instead of
parsing millions of strings: an id becomes a Python str only when it is asked for (the samples
of a micro-batch, the trace, a lookup by bisection), so loading costs the same at any size
(benchmarks/bench_index_cache.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpletuner.helpers.metadata.clip_timing import needs_retiming
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex, SizesView, SkippedFile
from simpletuner.helpers.metadata.index_history import DIGEST_KEY
from simpletuner.helpers.metadata.index_file import IndexFileError, read_columns, write_columns
from simpletuner.helpers.metadata.split import SortedIds
from simpletuner.helpers.metadata.video_buckets import bucket_frames

VERSION = 1  # of the index file's columns and header; another is rewritten by the main rank
_ENCODING = ("utf-8", "surrogatepass")  # any str, lone surrogates too, round-trips exactly
_DECODED_AT_ONCE = 1 << 16  # ids decoded per step when iterating


class StringColumn:
    """Strings stored as one blob, each followed by a NUL, and the offsets of their starts."""

    def __init__(self, blob: np.ndarray, starts: np.ndarray):
        self.blob, self.starts = blob, starts  # starts: one per string, then the blob's end

    @classmethod
    def encode(cls, texts: Sequence[str], *, may_hold_nul: bool = False) -> "StringColumn":
        """``may_hold_nul``: found by each string's length where one holds a NUL (a caption
        may; ``many`` cannot split those, ``at`` reads them whole)."""
        blob = ("\0".join(texts) + "\0").encode(*_ENCODING) if texts else b""
        data = np.frombuffer(blob, dtype=np.uint8)
        ends = np.flatnonzero(data == 0)
        if len(ends) != len(texts):
            if not may_hold_nul:
                raise ValueError("a string holds a NUL character, which this column cannot store")
            ends = np.cumsum([len(text.encode(*_ENCODING)) + 1 for text in texts]) - 1
        return cls(data, np.concatenate(([0], ends + 1)).astype(np.int64))

    def __len__(self) -> int:
        return len(self.starts) - 1

    def at(self, row: int) -> str:
        return self.blob[self.starts[row]:self.starts[row + 1] - 1].tobytes().decode(*_ENCODING)

    def many(self, rows: np.ndarray) -> list[str]:
        """The strings of ``rows``, decoded together: one gather of their bytes, one decode."""
        starts, ends = self.starts[rows], self.starts[rows + 1]
        lengths = ends - starts
        if not len(rows):
            return []
        shift = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        gathered = self.blob[np.arange(int(lengths.sum()), dtype=np.int64) + shift]
        return gathered.tobytes().decode(*_ENCODING).split("\0")[:-1]


class MappedIds(SortedIds):
    """A bucket's ids as rows of the mapped id column: the same Sequence of str, decoded on
    access. ``rows`` None: every row of the column."""

    def __init__(self, column: StringColumn, rows: np.ndarray | None = None):
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
        for start in range(0, len(self), _DECODED_AT_ONCE):
            positions = np.arange(start, min(start + _DECODED_AT_ONCE, len(self)))
            yield from self.column.many(self.rows_of(positions))

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
    texts: StringColumn
    known: np.ndarray  # bool per row: False where no caption is kept

    def text_of(self, sample_id: str) -> str | None:
        row = bisect_left(self.ids, sample_id)
        if row == len(self.ids) or self.ids[row] != sample_id or not self.known[row]:
            return None
        return self.texts.at(row)


def index_columns(ids: Sequence[str], widths: Sequence[int], heights: Sequence[int],
                  rows: Mapping[str, Sequence[int]],
                  captions: Sequence[str | None] | None) -> dict[str, np.ndarray]:
    """The columns of an index: the file table's ``ids``/sizes, the buckets' ``rows`` (in the
    sorted key order the header lists) and the captions aligned with the ids, if kept."""
    id_column = StringColumn.encode(ids)
    keys = sorted(rows)
    columns = {"id_bytes": id_column.blob, "id_starts": id_column.starts,
               "width": np.asarray(widths, np.int32), "height": np.asarray(heights, np.int32),
               "bucket_rows": np.concatenate([np.asarray(rows[key], np.int64) for key in keys]
                                             or [np.zeros(0, np.int64)]),
               "bucket_starts": np.cumsum([0] + [len(rows[key]) for key in keys], dtype=np.int64)}
    if captions is not None:
        texts = StringColumn.encode([text or "" for text in captions], may_hold_nul=True)
        columns.update(caption_bytes=texts.blob, caption_starts=texts.starts,
                       caption_known=np.array([text is not None for text in captions], bool))
    return columns


def index_meta(cache: Mapping[str, Any], clips: dict[str, list] | None,
               target_fps: int | None = None) -> dict[str, Any]:
    """The header of the index file made from the JSON cache ``cache`` (its digests recorded:
    backends/base.py), with a video table's clip columns (clip sets are small) and video.fps,
    which re-times the clips recorded at another rate."""
    index = cache["index"]
    if clips is not None:
        clips = {**clips, "target_fps": target_fps}
    return {"version": VERSION, "dataset_id": cache["dataset_id"], "settings": cache["settings"],
            DIGEST_KEY: cache[DIGEST_KEY], "index_digest": index["digest"],
            "buckets": sorted(index["buckets"]), "skipped": index["skipped"], "clips": clips}


def write_if_stale(path, meta: dict[str, Any], files, rows: Mapping[str, Sequence[int]],
                   captions: Sequence[str | None] | None) -> bool:
    """Write the index of ``files`` (a FileTable) with ``meta`` at ``path`` unless the file
    there is whole and holds this very ``meta`` (which names the JSON cache by its digests): so
    a cache written before there was one gains it once, and a damaged or truncated one is
    replaced, never trusted. True if written."""
    try:
        if load_columns(path).meta == meta:
            return False
    except IndexFileError:
        pass  # missing, from before, damaged: written now
    write_columns(path, meta, index_columns(files.ids, files.widths, files.heights, rows,
                                            captions))
    return True


@dataclass(frozen=True)
class LoadedIndex:
    meta: dict[str, Any]
    buckets: dict[str, MappedIds]
    sizes: MappedSizes
    captions: MappedCaptions | None
    clips: dict[str, ClipPlan]

    def index(self) -> DatasetIndex:
        """The DatasetIndex, with the digest the main rank recorded (no id is hashed)."""
        skipped = [SkippedFile(path, reason) for path, reason in self.meta["skipped"]]
        index = DatasetIndex(self.meta["dataset_id"], self.buckets, self.sizes, skipped,
                             self.clips)
        index.set_digest(self.meta["index_digest"])
        return index


def load_columns(path) -> LoadedIndex:
    """The index file at ``path`` mapped; IndexFileError if it is not a whole, undamaged one."""
    meta, c = read_columns(path)
    if meta.get("version") != VERSION:
        raise IndexFileError(f"{path}: written by another version ({meta.get('version')})")
    try:
        ids = MappedIds(StringColumn(c["id_bytes"], c["id_starts"]))
        keys, starts, rows = meta["buckets"], c["bucket_starts"], c["bucket_rows"]
        _check_rows(rows, starts, len(keys), len(ids))
        buckets = {key: MappedIds(ids.column, rows[starts[n]:starts[n + 1]])
                   for n, key in enumerate(keys)}
        excluded = frozenset(sample_id for sample_id, _ in meta["skipped"])
        captions = None
        if "caption_bytes" in c:
            captions = MappedCaptions(ids, StringColumn(c["caption_bytes"], c["caption_starts"]),
                                      c["caption_known"])
        clips = _clip_plans(buckets, meta.get("clips"))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise IndexFileError(f"{path}: a malformed index ({exc})") from exc
    return LoadedIndex(meta, buckets, MappedSizes(ids, c["width"], c["height"], excluded),
                       captions, clips)


def _check_rows(rows: np.ndarray, starts: np.ndarray, buckets: int, table_rows: int) -> None:
    """Each bucket ascending rows of the table (a few numpy passes: 0.05 s at 10 M rows), so
    its ids come out in canonical order without comparing one."""
    if len(starts) != buckets + 1 or starts[0] != 0 or starts[-1] != len(rows) or np.any(
            np.diff(starts) < 0):
        raise ValueError("the buckets' starts do not partition their rows")
    if len(rows) and (rows.min() < 0 or rows.max() >= table_rows):
        raise ValueError("a bucket's row lies outside the table")
    steps = np.diff(rows) > 0
    steps[starts[1:-1] - 1] = True  # where one bucket ends and the next begins
    if not steps.all():
        raise ValueError("a bucket's rows do not ascend")


def _clip_plans(buckets: dict[str, MappedIds], clips: dict[str, list] | None) -> dict:
    """A video index's ClipPlans, from the clip columns in the header (clip sets are small)."""
    if clips is None:
        return {}
    target, plans = clips.get("target_fps"), {}
    for key, ids in buckets.items():
        frames = bucket_frames(key)
        for row, sample_id in zip(ids.rows_of(np.arange(len(ids))).tolist(), ids):
            rate = clips["fps"][row]
            plans[sample_id] = ClipPlan(frames, rate, clips["frames"][row],
                                        clips["counted_by"][row],
                                        target if needs_retiming(rate, target) else None)
    return plans
