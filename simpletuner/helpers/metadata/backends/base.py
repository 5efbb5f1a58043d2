"""MetadataBackend: one dataset's discovery -> sizes -> buckets -> filters -> cached index.

The cache is one file, ``<output_dir>/cache/metadata/<dataset id>.index`` (index_cache.py):
the file table (what each file's header said, valid while its byte size and change key are
unchanged; it depends only on the file's bytes and Pillow's bomb limit, so a change of bucket
settings re-buckets without reading an image), the buckets and skips for ``settings``
(everything that affects bucketing), the captions known at indexing time (a table's, or caption
files fetched from remote storage; captions.py), and two digests the main rank computes as it
writes: ``data_digest``, which a checkpoint records (the file it replaces is kept under
``metadata/previous/`` to name changed files on resume, index_history.py), and the index's
own, which ranks agree on and the sampler's fingerprint holds. Ranks that read different caches
(storage not shared alike) see different digests. A JSON cache of an earlier version is removed
when the new one is written.

Every rank maps that file; only the main rank writes it, and only when its content changes.
Where the sizes come from is the metadata source: header probes (headers.py, 'discovery'), a
table (table.py, 'parquet') or a datasets-library split's rows (huggingface_rows.py); where the
bytes live is the storage (data_backend/storage.py). All make the same FileTable, so the index,
its cache and everything after it are one code.

A warm start (nothing changed) reads no image: it lists the storage (one stat per file, or one
request per 1000 objects) and maps the cache; a table's or a datasets split's listing is
compared with the cache's columns and the index taken as it is. benchmarks/bench_discovery.py
and bench_index_cache.py time it.
"""

from __future__ import annotations

import json
import logging
import posixpath
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends.bucketing import Bucketing
from simpletuner.helpers.metadata.backends.captions import (
    CaptionTable, fetch_caption_files, read_caption,
)
from simpletuner.helpers.metadata.backends.headers import FoundFiles, HeaderSource
from simpletuner.helpers.metadata.backends.huggingface_rows import HuggingFaceSource
from simpletuner.helpers.metadata.backends.table import TableSource
from simpletuner.helpers.metadata.buckets import (
    MAX_BUCKET_AREA_FACTOR, BucketSettings, SizeFilters,
)
from simpletuner.helpers.metadata.file_table import FileTable, FileTableFormatError
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.index_cache import (
    DIGEST_KEY, LoadedIndex, bucket_columns, cache_meta, caption_columns, file_columns,
    load_cache,
)
from simpletuner.helpers.metadata.index_columns import ListColumn, StringColumn
from simpletuner.helpers.metadata.index_file import ColumnFileWriter, IndexFileError
from simpletuner.helpers.metadata.index_history import IndexHistory, IndexVersion, data_digest
from simpletuner.helpers.metadata.split import BucketSlice, DatasetSpec, split_dataset

logger = logging.getLogger(__name__)


class MetadataCacheError(RuntimeError):
    """The cached index is missing or was written for other settings."""


class IndexAgreementError(RuntimeError):
    """Ranks loaded different bucket indexes; raised with the same message on every rank."""


@dataclass(frozen=True)
class RefreshReport:
    """What the last ``refresh_index`` did; the plan log prints it."""

    listed: int       # image files found
    reused: int       # sizes taken from the cache (file unchanged)
    read: int         # headers read (new or changed files)
    tabled: int       # sizes taken from a metadata table's or dataset's columns
    forgotten: int    # cache entries of files that are gone
    cache_written: bool


class MetadataBackend:
    def __init__(self, dataset: DatasetConfig, training: TrainingConfig, storage: Storage,
                 cache_dir: Path,
                 source: HeaderSource | TableSource | HuggingFaceSource | None = None):
        """``cache_dir`` is the run's cache folder, normally ``<output_dir>/cache``;
        ``source`` gives the sizes (default: header probes)."""
        self.dataset = dataset
        self.training = training
        self.storage = storage
        self.source = source or HeaderSource(storage, dataset.id)
        self.captions: CaptionTable | None = None  # set when the index holds the captions
        self.cache_path = Path(cache_dir) / "metadata" / f"{dataset.id}.index"
        self.history = IndexHistory(self.cache_path, dataset.id)
        self.data_digest: str | None = None  # the index cache's (index_history.py), once read
        self.bucket_settings = BucketSettings.for_dataset(dataset, training)
        self.filters = SizeFilters.for_dataset(dataset, training)
        kind = kind_of(dataset)
        self.video = (dataset.video_settings(training.model_family,
                                             training.validation_framerate)
                      if kind.has_clips else None)
        self.bucketing = Bucketing(dataset.id, self.bucket_settings, self.filters, self.video,
                                   dataset.caption_strategy == "textfile"
                                   and kind.reads_caption_files)
        self.last_refresh: RefreshReport | None = None

    @classmethod
    def from_config(cls, dataset: DatasetConfig, training: TrainingConfig) -> "MetadataBackend":
        """The dataset's storage and metadata backend, the cache under ``output_dir``."""
        storage = open_storage(dataset)
        if kind_of(dataset).has_clips:
            from simpletuner.helpers.metadata.backends.clip_source import ClipSource  # PyAV

            source = ClipSource(storage, dataset.id, TableSource(storage, dataset)
                                if dataset.metadata_backend == "parquet" else None)
        elif dataset.type == "huggingface":
            source = HuggingFaceSource(storage, dataset)
        elif dataset.metadata_backend == "parquet":
            source = TableSource(storage, dataset)
        else:
            source = HeaderSource(storage, dataset.id)
        return cls(dataset, training, storage, Path(training.output_dir) / "cache", source)

    # -- what the cache is keyed by -------------------------------------------------------

    def _file_entries_key(self) -> dict[str, Any]:
        """What a cached header reading depends on besides the file itself."""
        return {"storage": self.storage.location, "max_image_pixels": Image.MAX_IMAGE_PIXELS,
                **self.source.key()}

    def settings(self) -> dict[str, Any]:
        """Everything that affects which bucket a file lands in, or whether it is skipped."""
        ds, s, f = self.dataset, self.bucket_settings, self.filters
        return {
            **self._file_entries_key(),
            "resolution": s.resolution, "resolution_type": s.resolution_type,
            "aspect_bucket_alignment": s.alignment, "crop": ds.crop, "crop_aspect": ds.crop_aspect,
            "crop_aspect_buckets": list(s.aspect_buckets),
            "crop_aspect_weights": list(s.aspect_weights),
            "minimum_image_size": ds.minimum_image_size,
            "maximum_image_size": ds.maximum_image_size,
            # the limits in force (defaults included), so a new default re-buckets the cache
            "minimum_aspect_ratio": f.minimum_aspect_ratio,
            "maximum_aspect_ratio": f.maximum_aspect_ratio,
            "maximum_bucket_area": MAX_BUCKET_AREA_FACTOR * s.training_area,
            "caption_strategy": ds.caption_strategy,
            # Only when set (it lifts the maximum's skip), so older index caches stay valid.
            **({"target_downsample_size": ds.target_downsample_size}
               if ds.target_downsample_size is not None else {}),
            **({"video": self.video.key()} if self.video is not None else {}),
        }

    # -- discovery -----------------------------------------------------------------------

    def refresh_index(self, show_progress: bool = True) -> DatasetIndex:
        """List the storage, size new or changed files only, bucket, write the cache; the index
        returned is the mapped one every other rank loads, so the lists built here are freed."""
        self.history.remove_killed_writes()  # also when the cache there is taken as it is
        listing = self.storage.list_files()
        cached = self._read_cache()
        usable = cached is not None and cached.meta["files_key"] == self._file_entries_key()
        if (usable and self._cache_problem(cached) is None
                and self.source.unchanged(listing, cached)):
            return self._take_cached(cached)
        known = self._cached_files(cached) if usable else None
        with self.history.new_version(cached) as version:  # to disk while it is built
            found = self.source.read(listing, known or FileTable(), show_progress, version)
            # the ids as the cache stores them, also what the digests hash
            id_column = found.id_column or StringColumn.encode(found.files.ids)
            index, rows = self._bucket_into(version, found, listing, id_column,
                                            cached if known else None, known)
            skipped = index.skipped
            version.add(skipped.columns())
            digests = {DIGEST_KEY: data_digest(version.columns, found.files, rows, skipped),
                       "index_digest": index.digest()}
            meta = cache_meta(self.dataset.id, self._file_entries_key(), self.settings(),
                              found.files, rows, skipped, digests,
                              self.video.fps if self.video is not None else None)
            written = self.history.commit_if_changed(version, meta, cached)
        listed = len(found.files.ids)
        self.last_refresh = RefreshReport(
            listed=listed, reused=listed - found.read - found.tabled, read=found.read,
            tabled=found.tabled, forgotten=found.forgotten, cache_written=written)
        # Unwritten, the file is the one already mapped and checked above: not read again.
        # Written, it was flushed just now: mapped without reading it back for its CRC.
        return self._map_index(check_crc=False) if written else self._take(cached)

    def index_if_cached(self) -> DatasetIndex | None:
        """The index refresh_index would build, when the cache already holds the header of
        every listed file (nothing to read); else None. Writes nothing: ``check`` asks it."""
        cached = self._read_cache()
        if cached is None or cached.meta["files_key"] != self._file_entries_key():
            return None
        known = self._cached_files(cached)
        listing = self.storage.list_files()
        if known is None or known.reconcile(listing)[1]:
            return None
        found = self.source.read(listing, known, False)
        return self.bucketing.build(found, listing, ListColumn(found.files.ids))[0]

    def load_index(self) -> DatasetIndex:
        """The index the main process wrote, memory-mapped (index_cache.py); reads no image,
        lists no folder and parses no id."""
        return self._map_index(check_crc=True)

    def _map_index(self, check_crc: bool) -> DatasetIndex:
        try:
            loaded = load_cache(self.cache_path, check_crc=check_crc)
        except IndexFileError as exc:
            raise MetadataCacheError(
                f"dataset '{self.dataset.id}': no usable metadata cache at {self.cache_path} "
                f"({exc}); the main process writes it with refresh_index() (or run "
                "`python -m simpletuner plan`)") from exc
        problem = self._cache_problem(loaded)
        if problem:
            raise MetadataCacheError(f"dataset '{self.dataset.id}': the metadata cache at "
                                     f"{self.cache_path} {problem}; refresh it on the main "
                                     "process first")
        return self._take(loaded)

    def _cache_problem(self, loaded: LoadedIndex) -> str | None:
        if loaded.meta.get("settings") != self.settings():
            return "was written with other bucket settings"
        if self._captions_in_index() and loaded.captions is None:
            return "lacks its captions"
        return None

    def _take(self, loaded: LoadedIndex) -> DatasetIndex:
        self.captions = loaded.captions
        self.data_digest = loaded.meta[DIGEST_KEY]
        return loaded.index()

    def _take_cached(self, cached: LoadedIndex) -> DatasetIndex:
        """The source says the cache was built from exactly this data: take it as it is."""
        listed = len(cached.ids)
        self.last_refresh = RefreshReport(listed=listed, reused=listed, read=0, tabled=0,
                                          forgotten=0, cache_written=False)
        return self._take(cached)

    def index_version(self) -> IndexVersion | None:
        """The index cache the last refresh or load read (None before either)."""
        return None if self.data_digest is None else IndexVersion(self.data_digest, self.history)

    def caption_for(self, sample_id: str) -> str:
        if self.captions is not None:
            text = self.captions.text_of(sample_id)
            if text is None:
                raise KeyError(f"dataset '{self.dataset.id}': no caption for {sample_id!r} in the "
                               "index; refresh the index (the data changed?)")
            return text
        strategy = self.dataset.caption_strategy
        if strategy == "textfile":
            return read_caption(self.storage, sample_id)
        if strategy == "filename":
            stem = posixpath.splitext(posixpath.basename(sample_id))[0]
            return stem.replace("_", " ").strip()
        return self.dataset.instance_prompt or ""

    # -- the split, and the ranks' agreement: the only collectives of the data path ----------

    def split_spec(self, index: DatasetIndex) -> DatasetSpec:
        """This dataset's split settings: its batch override, repeats, kind, oversubscription,
        bucket tail (its own, else config.json's)."""
        ds = self.dataset
        return DatasetSpec(index.dataset_id, index.buckets, ds.repeats,
                           ds.train_batch_size or self.training.train_batch_size,
                           kind_of(ds).evaluates, self.training.allow_dataset_oversubscription,
                           ds.bucket_tail or self.training.bucket_tail)

    def split_buckets_between_processes(self, index: DatasetIndex, *, seed: int, epoch: int,
                                        processes: int, rank: int, accumulation: int,
                                        first_epoch: int = 0) -> dict[str, BucketSlice]:
        """This rank's slice of each bucket in ``epoch`` (pure; see split.py)."""
        return split_dataset(self.split_spec(index), seed=seed, epoch=epoch, processes=processes,
                             rank=rank, accumulation=accumulation, first_epoch=first_epoch)

    @staticmethod
    def resolve_shared_seed(configured: int | None, accelerator) -> int:
        """The configured seed, else one drawn on the main process and broadcast to all ranks."""
        # Imported here: check imports this file, torch-free.
        from accelerate.utils import broadcast_object_list

        from simpletuner.common.peer_watch import in_collective

        seed = configured
        if seed is None:
            drawn = secrets.randbits(64) if accelerator.is_main_process else None
            with in_collective("the shared seed's broadcast"):
                seed = broadcast_object_list([drawn])[0]
        if accelerator.is_main_process:
            source = "from config.json" if configured is not None else (
                "generated; set \"seed\": %d in config.json to reproduce this run" % seed)
            logger.info("shared shuffle seed: %d (%s)", seed, source)
        return seed

    @staticmethod
    def check_index_agreement(indexes: dict[str, DatasetIndex], load_error: str | None,
                              accelerator) -> None:
        """One gather of every rank's index digests; any difference fails every rank alike."""
        # Imported here: check imports this file, torch-free.
        from accelerate.utils import gather_object

        from simpletuner.common.peer_watch import in_collective

        mine = {"error": load_error,
                "digests": {dataset_id: index.digest() for dataset_id, index in indexes.items()}}
        with in_collective("the bucket index agreement"):
            everyone = gather_object([mine])
        errors = [f"  rank {rank}: {seen['error']}" for rank, seen in enumerate(everyone)
                  if seen["error"]]
        if errors:
            raise IndexAgreementError("some ranks could not load the bucket index written by the "
                                      "main process:\n" + "\n".join(errors))
        groups: dict[str, list[int]] = {}
        for rank, seen in enumerate(everyone):
            key = json.dumps(seen["digests"], sort_keys=True)
            groups.setdefault(key, []).append(rank)
        if len(groups) > 1:
            lines = []
            for key, ranks in groups.items():
                short = {d: digest[:12] for d, digest in json.loads(key).items()}
                lines.append(f"  ranks {', '.join(map(str, ranks))}: {short}")
            raise IndexAgreementError(
                "the ranks see different bucket indexes, so they would split different data:\n"
                + "\n".join(lines) + "\nPut instance_data_dir and output_dir on storage every "
                "node sees identically, and do not change the datasets while a run starts.")

    # -- internals -----------------------------------------------------------------------

    def _captions_in_index(self) -> bool:
        return self.dataset.caption_strategy in ("parquet", "huggingface") or (
            self.dataset.caption_strategy == "textfile" and self.storage.remote)

    def _bucket_into(self, version: ColumnFileWriter, found: FoundFiles, listing: Listing,
                     id_column: StringColumn, cached: LoadedIndex | None,
                     known: FileTable | None) -> tuple[DatasetIndex, dict[str, np.ndarray]]:
        """Bucket the files, adding each of the cache's columns to ``version`` once known: the
        file table and a table's captions go to disk while the buckets are made."""
        keeps_captions = self._captions_in_index()
        if not found.stored:
            version.add(file_columns(found.files, id_column))
            if keeps_captions and found.captions is not None:  # every usable row's
                version.add(caption_columns(CaptionTable(found.files.ids, found.captions)))
        index, rows = self.bucketing.build(found, listing, id_column)
        version.add(bucket_columns(rows))
        if keeps_captions and found.captions is None:
            version.add(caption_columns(self._caption_files(found.files.ids, rows, listing,
                                                            cached, known)))
        return index, rows

    def _caption_files(self, ids: list[str], rows: dict[str, np.ndarray], listing: Listing,
                       cached: LoadedIndex | None, known: FileTable | None) -> CaptionTable:
        """The remote caption files of the indexed samples (``rows``): changed ones fetched."""
        before = cached.caption_table(known.ids) if cached is not None else None
        indexed = sorted(row for bucket in rows.values() for row in bucket.tolist())
        return fetch_caption_files(self.storage, ids, indexed, listing, before)

    def _cached_files(self, cached: LoadedIndex) -> FileTable | None:
        try:
            return cached.file_table()
        except FileTableFormatError as exc:
            logger.warning("dataset '%s': ignoring the malformed metadata cache %s (%s); "
                           "rebuilding", self.dataset.id, self.cache_path, exc)
            return None

    def _read_cache(self) -> LoadedIndex | None:
        try:
            return load_cache(self.cache_path)
        except IndexFileError as exc:
            if self.cache_path.exists():
                logger.warning("dataset '%s': ignoring unusable metadata cache %s (%s); "
                               "rebuilding", self.dataset.id, self.cache_path, exc)
            return None
