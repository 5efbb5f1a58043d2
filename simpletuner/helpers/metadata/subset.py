"""``max_num_samples``: a fixed subset of a dataset, the same on every rank and in every run.

The kept samples are those with the smallest SHA-256 digests of (dataset id, sample id): they do
not depend on listing order, on the seed (the index is final before the seed is known) or on
which files were added later, beyond the new files themselves competing for a place.
"""

from __future__ import annotations

import hashlib

from simpletuner.common.names import name_bytes
from simpletuner.helpers.metadata.index import DatasetIndex


def _rank_key(dataset_id: str, sample_id: str) -> bytes:
    return hashlib.sha256(name_bytes(f"{dataset_id}\x00{sample_id}")).digest()


def limit_samples(index: DatasetIndex, max_num_samples: int | None) -> DatasetIndex:
    """``index`` keeping at most ``max_num_samples`` samples; the others are reported as
    skipped with the reason."""
    if max_num_samples is None or index.sample_count <= max_num_samples:
        return index
    samples = [s for ids in index.buckets.values() for s in ids]
    samples.sort(key=lambda s: _rank_key(index.dataset_id, s))
    reason = f"beyond max_num_samples {max_num_samples}"
    return index.without({s: reason for s in samples[max_num_samples:]})
