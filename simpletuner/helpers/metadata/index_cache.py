"""A dataset's index cache: one memory-mapped file the main rank writes and every rank maps.

``<cache>/metadata/<dataset id>.index`` (index_file.py: numpy columns, a JSON header, a CRC)
holds what discovery learnt and what it decided:

* the file table (file_table.py), as columns: the sorted ids as one UTF-8 blob (each id
  followed by a NUL, which no file name holds) with offsets, byte sizes, change keys (integers,
  or for ETags their JSON texts), widths and heights; in the header the rows' errors and a
  video table's clip columns (clip sets are small). A row is valid while its file's size and
  change key are unchanged, so a change of bucket settings re-buckets without reading an image;
* the index: each bucket as ascending rows of that table (so its ids come out in canonical
  order without comparing one); the skips as columns (their paths, a reason code each) with
  the distinct reasons in the header (a table naming millions of absent files skips millions);
  and in the header ``settings``, everything that affects bucketing;
* the captions the index keeps (a table's, or remote caption files with their change keys);
* two digests: ``data_digest`` (the listed files and the buckets: what a checkpoint records,
  index_history.py) and ``index_digest`` (DatasetIndex.digest(), what ranks agree on),
  computed once by the main rank as it writes, so no rank hashes every id at start-up.

A rank maps it instead of parsing millions of strings: an id becomes a Python str only when it
is asked for, so loading costs about the same at any size (benchmarks/bench_index_cache.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpletuner.common.atomic import json_text
from simpletuner.helpers.data_backend.storage import Listing
from simpletuner.helpers.metadata.backends.captions import CaptionTable
from simpletuner.helpers.metadata.backends.table_columns import ArrowTexts
from simpletuner.helpers.metadata.clip_timing import needs_retiming
from simpletuner.helpers.metadata.file_table import (
    CLIP_COLUMNS, FileTable, FileTableFormatError, ascending_strings,
)
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex, SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.index_columns import (
    MappedCaptions, MappedIds, MappedSizes, StringColumn, TextColumn,
)
from simpletuner.helpers.metadata.index_file import IndexFileError, read_columns
from simpletuner.helpers.metadata.video_buckets import bucket_frames

# 1: the index only, beside a JSON cache; 2: the whole cache, file table included; 3: a
# table's captions may be in the table's order, with the row of each file's (caption_rows);
# 4: the skips as columns (skipped.py), their reasons in the header, not [path, reason] pairs
VERSION = 4
READ_VERSIONS = (2, 3, 4)  # a version 2 cache is a version 3 one without caption_rows
DIGEST_KEY = "data_digest"
_COMPARED_AT_ONCE = 1 << 20  # listed files compared with the cache per slice


def _encode_json_texts(values: Sequence[Any]) -> StringColumn:
    return StringColumn.encode([json_text(value) for value in values])


def _change_key_columns(keys: Sequence[Any]) -> dict[str, np.ndarray]:
    """Integer change keys (mtime_ns) as int64, anything else (ETags) as JSON texts."""
    integers = np.asarray(keys) if len(keys) else np.zeros(0, np.int64)
    if integers.dtype.kind in "iu":
        return {"change_key": integers.astype(np.int64)}
    texts = _encode_json_texts(keys)
    return {"change_key_json": texts.blob, "change_key_json_starts": texts.starts}


def caption_columns(captions: CaptionTable) -> dict[str, np.ndarray]:
    """The captions of the file table's rows."""
    if isinstance(captions.texts, ArrowTexts):  # a table's: its Arrow buffers as they are
        columns = {**table_caption_texts(captions.texts), **table_caption_rows(captions.texts)}
    else:
        texts = TextColumn.encode([text or "" for text in captions.texts])
        columns = {"caption_bytes": texts.blob, "caption_starts": texts.starts,
                   "caption_known": np.array([text is not None for text in captions.texts])}
    if captions.keys is not None:  # remote caption files: fetched again only when changed
        keys = _encode_json_texts(captions.keys)
        columns.update(caption_key_json=keys.blob, caption_key_json_starts=keys.starts)
    return columns


def table_caption_texts(texts: ArrowTexts) -> dict[str, np.ndarray]:
    """A table's captions in its own order (known as soon as it is read)."""
    blob, starts = texts.text_column()
    return {"caption_bytes": blob, "caption_starts": starts}


def table_caption_rows(texts: ArrowTexts) -> dict[str, np.ndarray]:
    """Which file has a caption, and (rows not in the files' order) the row of each's."""
    return {"caption_known": texts.known(),
            **({"caption_rows": texts.rows} if texts.rows is not None else {})}


def listing_columns(id_column: StringColumn, sizes: Sequence[int],
                    change_keys: Sequence[Any]) -> dict[str, np.ndarray]:
    """The listed files of the file table: ids (encoded), sizes in bytes, change keys."""
    return {"id_bytes": id_column.blob, "id_starts": id_column.starts,
            "bytes": np.asarray(sizes, np.int64).reshape(-1), **_change_key_columns(change_keys)}


def size_columns(files: FileTable) -> dict[str, np.ndarray]:
    """The file table's image sizes."""
    return {"width": np.asarray(files.widths, np.int32).reshape(-1),
            "height": np.asarray(files.heights, np.int32).reshape(-1)}


def file_columns(files: FileTable, id_column: StringColumn) -> dict[str, np.ndarray]:
    """The file table (``id_column``: its ids encoded)."""
    return {**listing_columns(id_column, files.sizes, files.change_keys), **size_columns(files)}


def bucket_columns(rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The buckets' ``rows``, in the sorted key order the header lists."""
    keys = sorted(rows)
    return {"bucket_rows": np.concatenate([np.asarray(rows[key], np.int64) for key in keys]
                                          or [np.zeros(0, np.int64)]),
            "bucket_starts": np.cumsum([0] + [len(rows[key]) for key in keys], dtype=np.int64)}


def cache_columns(files: FileTable, id_column: StringColumn, rows: Mapping[str, np.ndarray],
                  captions: CaptionTable | None) -> dict[str, np.ndarray]:
    """The columns of a cache: the file table, the buckets and the captions, if kept."""
    columns = {**file_columns(files, id_column), **bucket_columns(rows)}
    return columns if captions is None else {**columns, **caption_columns(captions)}


def cache_meta(dataset_id: str, files_key: dict, settings: dict, files: FileTable,
               rows: Mapping[str, Sequence[int]], skipped: Sequence[SkippedFile], digests: dict,
               target_fps: int | None = None) -> dict[str, Any]:
    """The header: what the cache was built with and for, and what is not a column (of
    ``skipped``, whose columns go with the others, the reasons); ``digests``: DIGEST_KEY and
    ``index_digest``."""
    clips = None if files.clips is None else {**files.clips, "target_fps": target_fps}
    return {"version": VERSION, "dataset_id": dataset_id, "files_key": files_key,
            "settings": settings, **digests, "buckets": sorted(rows),
            "skipped_reasons": SkippedFiles.of(skipped).reasons, "errors": files.errors,
            "clips": clips}


def same_content(old: "LoadedIndex", meta: dict[str, Any], columns: dict[str, np.ndarray]) -> bool:
    """The cache ``old`` holds exactly this header and these columns (compared as memory)."""
    return old.meta == meta and old.columns.keys() == columns.keys() and all(
        np.array_equal(old.columns[name], values) for name, values in columns.items())


@dataclass(frozen=True)
class LoadedIndex:
    meta: dict[str, Any]
    columns: dict[str, np.ndarray]  # memory-mapped
    ids: MappedIds                  # every row of the file table
    buckets: dict[str, MappedIds]
    sizes: MappedSizes
    captions: MappedCaptions | None
    clips: dict[str, ClipPlan]
    skipped: SkippedFiles

    def index(self) -> DatasetIndex:
        """The DatasetIndex, with the digest the main rank recorded (no id is hashed)."""
        index = DatasetIndex(self.meta["dataset_id"], self.buckets, self.sizes, self.skipped,
                             self.clips)
        index.set_digest(self.meta["index_digest"])
        return index

    def _decoded_json_texts(self, name: str, rows: np.ndarray | None = None) -> list[str]:
        """The texts of a column of JSON texts (``rows``: all)."""
        column = StringColumn(self.columns[name], self.columns[f"{name}_starts"])
        return column.many(np.arange(len(column)) if rows is None else rows)

    def change_keys(self) -> list:
        if "change_key" in self.columns:
            return self.columns["change_key"].tolist()
        return list(map(json.loads, self._decoded_json_texts("change_key_json")))

    def same_files(self, listing: Listing) -> bool:
        """The listing names exactly this table's files, with the same sizes and change keys:
        compared as columns a slice at a time (no id of the table decoded, no second copy of
        the listing in memory)."""
        if len(listing.sample_ids) != len(self.ids):
            return False
        starts = self.columns["id_starts"]
        for first in range(0, len(self.ids), _COMPARED_AT_ONCE):
            last = min(first + _COMPARED_AT_ONCE, len(self.ids))
            listed = StringColumn.encode(listing.sample_ids[first:last]).blob
            if not (np.array_equal(listed, self.columns["id_bytes"][starts[first]:starts[last]])
                    and np.array_equal(np.asarray(listing.sizes[first:last], np.int64),
                                       self.columns["bytes"][first:last])
                    and self._same_change_keys(listing.change_keys[first:last], first)):
                return False
        return True

    def _same_change_keys(self, keys: list, first: int) -> bool:
        if "change_key" not in self.columns:  # ETags, as JSON texts
            stored = self._decoded_json_texts("change_key_json",
                                              np.arange(first, first + len(keys)))
            return stored == list(map(json_text, keys))
        listed = np.asarray(keys)
        return listed.dtype.kind in "iu" and np.array_equal(
            listed, self.columns["change_key"][first:first + len(keys)])

    def file_table(self) -> FileTable:
        """The file table as lists, to reconcile with a changed listing; FileTableFormatError if
        its ids do not ascend (a file edited by hand must not be trusted)."""
        ids = list(self.ids)
        if not ascending_strings(ids):
            raise FileTableFormatError("the ids of the file table are not ascending strings")
        clips = self.meta.get("clips")
        return FileTable(ids, self.columns["bytes"].tolist(), self.change_keys(),
                         self.columns["width"].tolist(), self.columns["height"].tolist(),
                         dict(self.meta["errors"]),
                         None if clips is None else {n: list(clips[n]) for n in CLIP_COLUMNS})

    def caption_table(self, ids: list[str]) -> CaptionTable | None:
        """The kept captions as lists (``ids``: file_table()'s), to fetch only changed ones."""
        if self.captions is None:
            return None
        texts = [self.captions.text_at(row) if known else None
                 for row, known in enumerate(self.captions.known.tolist())]
        keys = None
        if "caption_key_json" in self.columns:
            keys = list(map(json.loads, self._decoded_json_texts("caption_key_json")))
        return CaptionTable(ids, texts, keys)

    def change_view(self) -> dict[str, Any]:
        """The files and buckets as data_changes.py reads them."""
        starts = self.columns["bucket_starts"].tolist()
        rows = self.columns["bucket_rows"]
        return {"files": {"ids": list(self.ids), "bytes": self.columns["bytes"].tolist(),
                          "change_key": self.change_keys()},
                "index": {"buckets": {key: rows[starts[n]:starts[n + 1]].tolist()
                                      for n, key in enumerate(self.meta["buckets"])}}}


def load_cache(path, *, check_crc: bool = True) -> LoadedIndex:
    """The cache at ``path`` mapped; IndexFileError if it is not a whole, undamaged one
    (``check_crc`` False: this process has just written it, see read_columns)."""
    meta, c = read_columns(path, check_crc=check_crc)
    if meta.get("version") not in READ_VERSIONS:
        raise IndexFileError(f"{path}: written by another version ({meta.get('version')})")
    try:
        ids = MappedIds(StringColumn(c["id_bytes"], c["id_starts"]))
        keys, starts, rows = meta["buckets"], c["bucket_starts"], c["bucket_rows"]
        _check_rows(rows, starts, len(keys), len(ids))
        for name in ("bytes", "width", "height"):
            if len(c[name]) != len(ids):
                raise ValueError(f"the column {name!r} and the ids differ in length")
        buckets = {key: MappedIds(ids.column, rows[starts[n]:starts[n + 1]])
                   for n, key in enumerate(keys)}
        skipped = _skipped(meta, c)
        captions = None
        if "caption_bytes" in c:
            captions = _mapped_captions(ids, c)
        clips = _clip_plans(buckets, meta.get("clips"))
        if not isinstance(meta["errors"], dict) or not isinstance(meta["files_key"], dict):
            raise TypeError("errors or files_key is not a mapping")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise IndexFileError(f"{path}: a malformed index ({exc})") from exc
    return LoadedIndex(meta, c, ids, buckets, MappedSizes(ids, c["width"], c["height"],
                                                          skipped.among(ids)), captions, clips,
                       skipped)


def _skipped(meta: dict[str, Any], c: dict[str, np.ndarray]) -> SkippedFiles:
    """The skips: columns and reasons (version 4; none written: no skip), or [path, reason]
    pairs in the header (earlier versions)."""
    if "skipped" in meta:
        return SkippedFiles.of(SkippedFile(path, reason) for path, reason in meta["skipped"])
    if "skipped_codes" not in c and meta["skipped_reasons"] == []:
        return SkippedFiles.of([])
    return SkippedFiles.from_columns(c, meta["skipped_reasons"])


def _mapped_captions(ids: MappedIds, c: dict[str, np.ndarray]) -> MappedCaptions:
    texts, rows = TextColumn(c["caption_bytes"], c["caption_starts"]), c.get("caption_rows")
    if len(c["caption_known"]) != len(ids) or (rows is not None and len(rows) != len(ids)):
        raise ValueError("the caption columns and the ids differ in length")
    if rows is not None and len(rows) and (rows.min() < -1 or rows.max() >= len(texts)):
        raise ValueError("a caption row lies outside the captions")
    return MappedCaptions(ids, texts, c["caption_known"], rows)


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
