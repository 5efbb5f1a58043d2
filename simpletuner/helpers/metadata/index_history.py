"""Earlier versions of a dataset's index cache, so a resume on changed data can name the files.

A checkpoint does not carry the dataset: its sampler state holds, per dataset, the digest of
the index cache its run started from (``cache_digest``: the listed files with their sizes and
change keys, and the buckets), a few dozen bytes at any dataset size. When the main process
replaces an index cache with a different one, the old file is kept as
``<cache>/metadata/previous/<dataset id>/<digest>.json`` (the newest ``KEPT_VERSIONS``), so a
resume that finds another digest compares that file with the current one (data_changes.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simpletuner.common.atomic import atomic_write_json, atomic_write_with, json_text
from simpletuner.helpers.metadata.data_changes import describe_file_changes

PREVIOUS_FOLDER = "previous"
KEPT_VERSIONS = 3  # per dataset; each is as large as the index cache
DIGEST_KEY = "data_digest"


def cache_digest(cache: Mapping[str, Any]) -> str:
    """What decides the sample table: the listed files (ids, sizes, change keys), the buckets and
    the skips. The one an index cache records, else computed (caches written before it)."""
    stored = cache.get(DIGEST_KEY)
    if isinstance(stored, str):
        return stored
    files, index = cache["files"], cache["index"]
    digest = hashlib.sha256(len(files["ids"]).to_bytes(8, "little"))
    # ids joined by NUL (no file name holds one), integer columns as int64 bytes: a few times
    # faster than JSON-encoding them, at a million rows
    digest.update("\0".join(files["ids"]).encode("utf-8", "surrogatepass"))
    for column in (files["bytes"], files["change_key"]):
        digest.update(_column_bytes(column))
    for key, rows in sorted(index["buckets"].items()):
        digest.update(json_text(key).encode("utf-8") + _column_bytes(rows))
    digest.update(json_text(index["skipped"]).encode("utf-8"))
    return digest.hexdigest()


def _column_bytes(values: list) -> bytes:
    """Integers as int64 bytes; anything else (S3 ETags) as its JSON."""
    try:
        return np.asarray(values, dtype=np.int64).tobytes()
    except (TypeError, ValueError, OverflowError):
        return json_text(values).encode("utf-8")


class IndexHistory:
    """One dataset's index cache file and its kept earlier versions."""

    def __init__(self, cache_path: Path, dataset_id: str):
        self.cache_path = cache_path
        self.dataset_id = dataset_id
        self.folder = cache_path.parent / PREVIOUS_FOLDER / dataset_id

    def write_if_changed(self, new: dict[str, Any], old: Mapping[str, Any] | None,
                         derived: Path | None = None) -> bool:
        """Write ``new`` over the cache ``old`` was read from unless they are the same; keep the
        old file first when the sample table differs. ``new`` gains its digest (DIGEST_KEY).
        ``derived``: a file made from the cache, removed before it is replaced, so a crash
        between the two writes leaves none that is stale. True if written."""
        new.pop(DIGEST_KEY, None)
        digest = new[DIGEST_KEY] = cache_digest(new)
        if old is not None:
            if old == new:  # a cache from before digests differs: it gains one
                return False
            previous = cache_digest(old)
            if previous != digest and self.cache_path.is_file():
                self._keep(previous)
        if derived is not None:
            derived.unlink(missing_ok=True)
        atomic_write_json(self.cache_path, new)
        return True

    def _keep(self, digest: str) -> None:
        """The current cache file as version ``digest``: a hard link (no copy) where the
        filesystem allows one; the oldest versions past KEPT_VERSIONS are removed."""
        target = self.folder / f"{digest}.json"
        atomic_write_with(target, lambda tmp_name: _link_or_copy(self.cache_path, tmp_name))
        kept = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns,
                      reverse=True)
        for stale in kept[KEPT_VERSIONS:]:
            stale.unlink(missing_ok=True)

    def changes_since(self, digest: str) -> list[str]:
        """Lines naming the files changed between version ``digest`` and the current cache."""
        kept = self.folder / f"{digest}.json"
        before, now = _read(kept), _read(self.cache_path)
        if before is None or now is None:
            return [f"dataset '{self.dataset_id}': the index cache the checkpoint was saved with "
                    f"is no longer kept in {self.folder} (the last {KEPT_VERSIONS} are), so the "
                    "changed files cannot be named"]
        try:  # naming the files is a courtesy: a damaged old cache must not stop the resume
            if cache_digest(before) != digest:
                raise ValueError("its content does not match its name")
            return describe_file_changes(self.dataset_id, before, now)
        except (LookupError, TypeError, ValueError) as exc:
            return [f"dataset '{self.dataset_id}': the changed files cannot be named: the kept "
                    f"index cache {kept} is damaged ({type(exc).__name__}: {exc})"]


def _link_or_copy(source: Path, tmp_name: str) -> None:
    os.unlink(tmp_name)
    try:
        os.link(source, tmp_name)
    except OSError:  # a filesystem without hard links
        shutil.copyfile(source, tmp_name)
    os.utime(tmp_name)  # the link shares the source's mtime: make it the newest kept


def _read(path: Path) -> dict[str, Any] | None:
    try:
        cache = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cache if isinstance(cache, dict) and "files" in cache and "index" in cache else None


@dataclass(frozen=True)
class IndexVersion:
    """The index cache a dataset's index was read from: its digest, and the kept versions."""

    digest: str
    history: IndexHistory
