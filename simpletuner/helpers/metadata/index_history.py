"""Earlier versions of a dataset's index cache, so a resume on changed data can name the files.

A checkpoint does not carry the dataset: its sampler state holds, per dataset, the digest of
the index cache its run started from (``data_digest``: the listed files with their sizes and
change keys, and the buckets), a few dozen bytes at any dataset size. When the main process
replaces an index cache with one of another digest, the old file is kept as
``<cache>/metadata/previous/<dataset id>/<digest>.index`` (the newest ``KEPT_VERSIONS``), so a
resume that finds another digest compares that file with the current one (data_changes.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from simpletuner.common.atomic import atomic_write_with, json_text
from simpletuner.common.stale_temporaries import remove_stale_temporaries
from simpletuner.helpers.metadata.data_changes import describe_file_changes
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index_cache import (
    DIGEST_KEY, LoadedIndex, load_cache, same_content,
)
from simpletuner.helpers.metadata.index_file import ColumnFileWriter, IndexFileError
from simpletuner.helpers.metadata.skipped import SkippedFiles

PREVIOUS_FOLDER = "previous"
KEPT_VERSIONS = 3  # per dataset; each is as large as the index cache
LEGACY_SUFFIX = ".json"
_HASHED_AT_ONCE = 1 << 16  # skips hashed per step  # the JSON index cache of versions before the mapped one


def data_digest(columns: Mapping[str, np.ndarray], files: FileTable,
                rows: Mapping[str, Sequence[int]], skipped: SkippedFiles | list) -> str:
    """What decides the sample table: the listed files (ids, sizes, change keys), the buckets and
    the skips (SkippedFiles, or ``[path, reason]`` pairs), hashed from the cache's columns
    (cache_columns)."""
    digest = hashlib.sha256(len(files.ids).to_bytes(8, "little"))
    digest.update(memoryview(columns["id_bytes"][:-1]))  # the ids joined by NUL
    digest.update(columns["bytes"].tobytes())
    digest.update(columns["change_key"].tobytes() if "change_key" in columns
                  else json_text(files.change_keys).encode("utf-8"))  # ETags
    for key in sorted(rows):
        digest.update(json_text(key).encode("utf-8") + np.asarray(rows[key], np.int64).tobytes())
    if isinstance(skipped, SkippedFiles):
        _hash_skips(digest, skipped)
    else:
        digest.update(json_text(skipped).encode("utf-8"))
    return digest.hexdigest()


def _hash_skips(digest, skipped: SkippedFiles) -> None:
    """Hash json_text of the skips as [path, reason] pairs (the digest a cache of the earlier
    versions recorded), a slice at a time: no text or list of them all."""
    digest.update(b"[")
    for first in range(0, len(skipped), _HASHED_AT_ONCE):
        last = min(first + _HASHED_AT_ONCE, len(skipped))
        reasons = [skipped.reasons[code] for code in skipped.codes[first:last].tolist()]
        pairs = json_text(list(map(list, zip(skipped.path_slice(first, last), reasons))))
        digest.update(((", " if first else "") + pairs[1:-1]).encode("utf-8"))
    digest.update(b"]")


class IndexHistory:
    """One dataset's index cache file and its kept earlier versions."""

    def __init__(self, cache_path: Path, dataset_id: str):
        self.cache_path = cache_path
        self.dataset_id = dataset_id
        self.folder = cache_path.parent / PREVIOUS_FOLDER / dataset_id

    def remove_killed_writes(self) -> None:
        """The temporary files of writers killed mid-write here (as large as the cache)."""
        remove_stale_temporaries(self.cache_path.parent)
        remove_stale_temporaries(self.folder)

    def new_version(self, old: LoadedIndex | None) -> ColumnFileWriter:
        """A new cache file, on its way to disk as its columns are added, so the writing
        overlaps the index's last steps; ``commit_if_changed`` ends it. With ``old`` (the cache
        there) the rebuild may come out the same: nothing is written before that is known."""
        return ColumnFileWriter(self.cache_path, write_early=old is None)

    def commit_if_changed(self, version: ColumnFileWriter, meta: dict,
                          old: LoadedIndex | None) -> bool:
        """Put ``version`` in place unless ``old`` (the cache there) holds the same (then the
        with block removes the file written for nothing); keep the old file first when the
        sample table differs. True if committed."""
        if old is not None and same_content(old, meta, version.columns):
            return False
        if old is not None and old.meta[DIGEST_KEY] != meta[DIGEST_KEY]:
            self._keep(old.meta[DIGEST_KEY])
        version.commit(meta)  # by rename: mapped old files stay whole
        self.cache_path.with_suffix(LEGACY_SUFFIX).unlink(missing_ok=True)
        return True

    def _keep(self, digest: str) -> None:
        """The current cache file as version ``digest``: a hard link (no copy) where the
        filesystem allows one; the oldest versions past KEPT_VERSIONS are removed."""
        target = self.folder / f"{digest}{self.cache_path.suffix}"
        atomic_write_with(target, lambda tmp_name: _link_or_copy(self.cache_path, tmp_name))
        kept = sorted(self.folder.glob(f"*{self.cache_path.suffix}"),
                      key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for stale in kept[KEPT_VERSIONS:]:
            stale.unlink(missing_ok=True)

    def changes_since(self, digest: str) -> list[str]:
        """Lines naming the files changed between version ``digest`` and the current cache."""
        kept = self.folder / f"{digest}{self.cache_path.suffix}"
        if not kept.is_file():
            return [f"dataset '{self.dataset_id}': the index cache the checkpoint was saved with "
                    f"is no longer kept in {self.folder} (the last {KEPT_VERSIONS} are), so the "
                    "changed files cannot be named"]
        try:  # naming the files is a courtesy: a damaged old cache must not stop the resume
            before, now = load_cache(kept), load_cache(self.cache_path)
            if before.meta[DIGEST_KEY] != digest:
                raise ValueError("its content does not match its name")
            return describe_file_changes(self.dataset_id, before.change_view(),
                                         now.change_view())
        except (IndexFileError, LookupError, TypeError, ValueError) as exc:
            return [f"dataset '{self.dataset_id}': the changed files cannot be named: the kept "
                    f"index cache {kept} is damaged ({type(exc).__name__}: {exc})"]


def _link_or_copy(source: Path, tmp_name: str) -> None:
    os.unlink(tmp_name)
    try:
        os.link(source, tmp_name)
    except OSError:  # a filesystem without hard links
        shutil.copyfile(source, tmp_name)
    os.utime(tmp_name)  # the link shares the source's mtime: make it the newest kept


@dataclass(frozen=True)
class IndexVersion:
    """The index cache a dataset's index was read from: its digest, and the kept versions."""

    digest: str
    history: IndexHistory
