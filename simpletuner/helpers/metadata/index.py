"""The bucket index of one dataset: plain data every later stage reads, never mutates."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from simpletuner.helpers.metadata.split import SortedIds, canonical_ids


@dataclass(frozen=True)
class SkippedFile:
    path: str    # sample id (path relative to the dataset root, '/' separators)
    reason: str  # human-readable, e.g. "truncated or unreadable header"


@dataclass
class DatasetIndex:
    dataset_id: str
    buckets: dict[str, SortedIds]              # "WxH" -> sorted sample ids
    original_sizes: Mapping[str, tuple[int, int]]  # sample id -> (width, height), EXIF-oriented
    skipped: list[SkippedFile] = field(default_factory=list)

    def __post_init__(self):
        # Any list is accepted and put in canonical order once, here (see SortedIds).
        self.buckets = {key: canonical_ids(ids) for key, ids in self.buckets.items()}

    @property
    def sample_count(self) -> int:
        return sum(len(ids) for ids in self.buckets.values())

    def digest(self) -> str:
        """Stable across processes and machines: ranks compare it to agree on the index."""
        payload = json.dumps([self.dataset_id, dict(sorted(self.buckets.items()))],
                             separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def without(self, removed: dict[str, str]) -> "DatasetIndex":
        """A copy without ``removed`` (sample id -> reason), which are reported as skipped."""
        if not removed:
            return self
        buckets = {}
        for key, ids in self.buckets.items():
            kept = SortedIds(s for s in ids if s not in removed)
            if kept:
                buckets[key] = kept
        sizes = {s: wh for s, wh in self.original_sizes.items() if s not in removed}
        skipped = self.skipped + [SkippedFile(s, r) for s, r in sorted(removed.items())]
        return DatasetIndex(self.dataset_id, buckets, sizes, skipped)
