"""How a dataset's file table becomes its buckets: each distinct size decided once (the size
filters, the bucket math), per sample where crop_aspect 'random' draws the aspect or a clip's
frame count joins the key, and samples without their caption file skipped."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simpletuner.configuration.video_block import VideoSettings
from simpletuner.helpers.data_backend.storage import Listing
from simpletuner.helpers.metadata.backends.captions import caption_file_for
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.buckets import (
    BucketSettings, SizeFilters, bucket_for, sample_bucket,
)
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import DatasetIndex, SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.index_columns import ListColumn, MappedIds, StringColumn
from simpletuner.helpers.metadata.split import SortedIds
from simpletuner.helpers.metadata.video_buckets import clip_plans, with_frames

_COUNTED_SIDES = 1 << 16  # sizes with sides below this are told apart by counting

MISSING_CAPTION = "missing caption: no <name>.txt beside the file (caption_strategy 'textfile')"


def distinct_sizes(widths: np.ndarray, heights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(widths << 32 | heights, return_inverse=True)``; counted instead of sorted
    where the sides and their combinations are few (what tables of images hold)."""
    small = len(widths) and (min(widths.min(), heights.min()) >= 0
                             and max(widths.max(), heights.max()) < _COUNTED_SIDES)
    if small:
        width_values, width_of = _counted(widths, _COUNTED_SIDES)
        height_values, height_of = _counted(heights, _COUNTED_SIDES)
        pairs = len(width_values) * len(height_values)
        if pairs <= _COUNTED_SIDES:
            pair_values, which = _counted(width_of * len(height_values) + height_of, pairs)
            return (width_values[pair_values // len(height_values)] << 32
                    | height_values[pair_values % len(height_values)]), which
    return np.unique(widths << 32 | heights, return_inverse=True)


def _counted(values: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, ascending; each value's place among them), for 0 <= values <
    bound: one count of each value instead of a sort."""
    present = np.bincount(values, minlength=bound) > 0
    place = np.cumsum(present) - 1
    return np.flatnonzero(present).astype(np.int64), place[values]


@dataclass(frozen=True)
class Bucketing:
    dataset_id: str
    settings: BucketSettings
    filters: SizeFilters
    video: VideoSettings | None  # a video dataset's frame settings
    caption_files: bool          # caption_strategy 'textfile': a sample needs its .txt

    def build(self, found: FoundFiles, listing: Listing, id_column: ListColumn | StringColumn
              ) -> tuple[DatasetIndex, dict[str, np.ndarray]]:
        """The index, and each bucket as ascending rows of ``files`` (what the cache stores).

        ``files`` is in sample id order (the listing's), so a bucket's rows give its ids in
        canonical order: a view of them in ``id_column`` (the file table's ids, as a list or
        encoded for the cache) the split takes without checking it again. Sizes repeat (one
        camera, one export setting), so each distinct size is decided once and the rows follow
        in numpy."""
        files = found.files
        skipped = [SkippedFile(path, reason) for path, reason in listing.unreadable]
        widths, heights = np.asarray(files.widths, np.int64), np.asarray(files.heights, np.int64)
        sized = np.flatnonzero(widths > 0)  # the others' headers could not be used
        skipped += [SkippedFile(files.ids[row], files.errors[files.ids[row]])
                    for row in np.flatnonzero(widths <= 0).tolist()]
        distinct, which = distinct_sizes(widths[sized], heights[sized])
        decisions = [self._decide(size >> 32, size & 0xFFFFFFFF) for size in distinct.tolist()]
        refused = np.array([reason is not None for reason, _ in decisions], bool)[which]
        skipped += [SkippedFile(files.ids[sized[at]], decisions[which[at]][0])
                    for at in np.flatnonzero(refused).tolist()]
        bucket, keys = self._bucket_numbers(files, sized, which, decisions, refused, skipped)
        if self.caption_files:
            bucket = self._without_caption_files(files.ids, sized, bucket, listing, skipped)
        kept = bucket >= 0
        # bucket numbers as int16 where they fit: numpy's stable sort of those is a radix sort
        numbers = bucket[kept].astype(np.int16 if len(keys) < 1 << 15 else np.int64)
        order = sized[kept][np.argsort(numbers, kind="stable")]
        counts = np.bincount(bucket[kept], minlength=len(keys)).tolist()
        ordered = {key: part for key, part in
                   zip(keys, np.split(order, np.cumsum(counts)[:-1])) if len(part)}
        # a table's skips are columns (millions of absent files): joined as columns, sorted
        skipped = SkippedFiles.of(found.skipped).joined(SkippedFiles.of(skipped)).sorted()
        buckets = {key: MappedIds(id_column, rows) for key, rows in ordered.items()}
        sizes = files.image_sizes(set(skipped.among(files.ids)))
        index = DatasetIndex(self.dataset_id, buckets, sizes, skipped,
                             self.clip_plans(buckets, files))
        return index, ordered

    def clip_plans(self, buckets: dict[str, SortedIds], files: FileTable) -> dict:
        return clip_plans(buckets, files, self.video.fps) if self.video is not None else {}

    def _decide(self, width: int, height: int) -> tuple[str | None, str | None]:
        """(why an image of this size is skipped, or None; its bucket key, or None when
        skipped or drawn per sample)."""
        reason = self.filters.reason_to_skip(width, height)
        if reason is not None or self.settings.draws_aspect:
            return reason, None
        key = bucket_for(width, height, self.settings)
        oversized = self.settings.oversized(key)
        return oversized, None if oversized else key

    def _bucket_numbers(self, files: FileTable, sized, which, decisions, refused,
                        skipped: list[SkippedFile]):
        """(each sized row's bucket number, -1 if refused; the sorted bucket keys). A size's
        bucket is decided once, unless crop_aspect 'random' draws it per sample (a drawn
        bucket that is oversized is refused here, and added to ``skipped``)."""
        settings = self.settings
        if settings.draws_aspect:
            rows = sized.tolist()
            names = [None if no else sample_bucket(self.dataset_id, files.ids[row],
                                                   files.widths[row], files.heights[row],
                                                   settings)
                     for row, no in zip(rows, refused.tolist())]
            why = {key: settings.oversized(key) for key in set(names) - {None}}
            skipped += [SkippedFile(files.ids[row], why[key])
                        for row, key in zip(rows, names) if key is not None and why[key]]
            names = [None if key is None or why[key] else key for key in names]
        else:
            names = [key for _, key in decisions]
        per_row = settings.draws_aspect or self.video is not None
        if self.video is not None:  # a clip's bucket also depends on its frame count
            rows = sized.tolist()
            names = names if settings.draws_aspect else [names[w] for w in which.tolist()]
            names = with_frames(names, [files.ids[row] for row in rows],
                                [files.clips["frames"][row] for row in rows], self.video, skipped,
                                [files.clips["fps"][row] for row in rows])
        keys = sorted({key for key in names if key is not None})
        number = {key: n for n, key in enumerate(keys)}
        bucket = np.array([number.get(key, -1) for key in names], np.int64)
        return (bucket if per_row else bucket[which]), keys

    @staticmethod
    def _without_caption_files(ids: list[str], sized, bucket, listing: Listing,
                               skipped: list[SkippedFile]):
        """``bucket`` with -1 for the samples whose caption file is not listed."""
        bucket = bucket.copy()
        for at in np.flatnonzero(bucket >= 0).tolist():
            sample_id = ids[sized[at]]
            if caption_file_for(sample_id) not in listing.captions:
                bucket[at] = -1
                skipped.append(SkippedFile(sample_id, MISSING_CAPTION))
        return bucket
