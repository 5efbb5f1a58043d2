"""Which occurrence of which sample goes to which rank: pure functions of plain data.

Every rank calls these with the same inputs and gets its own part of one shared answer:

1. A bucket's occurrences are put in a canonical order (sample ids sorted, each id ``repeats+1``
   times in a row), so listing order, cache order and ``PYTHONHASHSEED`` cannot matter.
2. A permutation of occurrence *indices* fixed by a SHA digest of ``(seed, dataset id, bucket,
   epoch)`` (permutation.py; no copy of the id list) is evaluated at this rank's positions only;
   the global random/numpy/torch RNGs are never used.
3. The tail beyond a multiple of the effective batch ``E = batch x processes x accumulation`` is
   trimmed and reported; it changes with the epoch because the permutation does.
4. Kept occurrences are laid out as ``(micro-batch, rank, batch)``: micro-batch ``j`` of every
   rank comes from positions ``j*B*W .. (j+1)*B*W``, and rank ``w`` takes its ``B`` of them. So
   each optimizer step's ``E`` occurrences are consecutive in the permutation, and every rank
   gets the same number of micro-batches, a multiple of the accumulation steps.

Nothing here calls torch.distributed; a test can run every rank in one process.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from itertools import islice
from typing import Mapping, Sequence

import numpy as np

from simpletuner.common.names import printable
from simpletuner.helpers.metadata.permutation import StableShuffle


# Which samples go where changes with this; a sampler state saved under another version is
# warned about on resume. 2: buckets of 65 536+ occurrences shuffle with a Feistel network.
SPLIT_VERSION = 2
NAMED_PER_BUCKET = 3  # an undersized bucket names its first files: often one odd image


class UndersizedBucketsError(ValueError):
    """A bucket holds fewer occurrences than one effective batch; the message lists the fixes."""


@dataclass(frozen=True)
class EffectiveBatch:
    """``E`` and its factors, kept apart so messages can name each one."""

    batch_size: int    # samples per micro-batch on one rank
    processes: int
    accumulation: int  # micro-batches per optimizer step
    evaluation: bool = False

    @classmethod
    def for_dataset(cls, batch_size: int, processes: int, accumulation: int,
                    evaluation: bool = False) -> "EffectiveBatch":
        # Evaluation is not trained on: one sample per rank per step, no accumulation.
        if evaluation:
            return cls(1, processes, 1, evaluation=True)
        return cls(batch_size, processes, accumulation)

    @property
    def total(self) -> int:
        return self.batch_size * self.processes * self.accumulation

    def describe(self) -> str:
        if self.evaluation:
            return (f"{self.total} ({self.processes} processes; evaluation dataset: one sample "
                    "per process, gradient accumulation ignored)")
        return (f"{self.total} (train_batch_size {self.batch_size} x {self.processes} processes "
                f"x {self.accumulation} gradient_accumulation_steps)")


@dataclass(frozen=True)
class DatasetSpec:
    """What the split needs to know about one dataset; the same on every rank."""

    dataset_id: str
    buckets: Mapping[str, Sequence[str]]   # "WxH" -> sample ids (any order)
    repeats: int = 0
    batch_size: int = 1                    # the dataset's train_batch_size (override or global)
    evaluation: bool = False
    allow_oversubscription: bool = False

    def effective_batch(self, processes: int, accumulation: int) -> EffectiveBatch:
        return EffectiveBatch.for_dataset(self.batch_size, processes, accumulation, self.evaluation)


@dataclass(frozen=True)
class BucketCounts:
    samples: int
    occurrences: int   # per epoch, before trimming
    kept: int          # a multiple of E
    trimmed: int
    extended: bool     # cyclically extended to E by allow_dataset_oversubscription
    effective: EffectiveBatch

    @property
    def micro_batches(self) -> int:
        """Per rank and epoch; a multiple of the accumulation steps."""
        return self.kept // (self.effective.batch_size * self.effective.processes)

    @property
    def optimizer_steps(self) -> int:
        return self.kept // self.effective.total


def bucket_counts(samples: int, repeats: int, effective: EffectiveBatch,
                  allow_oversubscription: bool = False) -> BucketCounts:
    """The arithmetic of one bucket, shared by the split, the check and ``plan``."""
    e = effective.total
    occurrences = samples * (repeats + 1)
    if allow_oversubscription and repeats == 0 and 0 < occurrences < e:
        return BucketCounts(samples, e, e, 0, True, effective)
    kept = occurrences - occurrences % e
    return BucketCounts(samples, occurrences, kept, occurrences - kept, False, effective)


def check_bucket_sizes(datasets: Sequence[DatasetSpec], processes: int,
                       accumulation: int) -> list[str]:
    """Raise one error for every bucket too small to fill an effective batch, across datasets.

    Returns report lines for buckets that oversubscription extended. Every rank has the same
    data, so every rank raises the same message (no rank is left in a collective).
    """
    failures: list[str] = []
    notes: list[str] = []
    for spec in datasets:
        eff = spec.effective_batch(processes, accumulation)
        e = eff.total
        sizes = {key: len(ids) for key, ids in sorted(spec.buckets.items())}
        samples = sum(sizes.values())
        copies = spec.repeats + 1
        if samples == 0:
            failures.append(f"Dataset '{spec.dataset_id}' has no usable samples; check its "
                            "instance_data_dir and the skipped-file report of `plan`.")
            continue
        bad = {}
        for key, n in sizes.items():
            counts = bucket_counts(n, spec.repeats, eff, spec.allow_oversubscription)
            if counts.extended:
                notes.append(f"dataset '{spec.dataset_id}' bucket {key}: {n} samples extended "
                             f"cyclically to {e} occurrences per epoch "
                             "(allow_dataset_oversubscription)")
            elif counts.kept == 0:
                bad[key] = n
        if not bad:
            continue
        lines = [
            f"Dataset '{spec.dataset_id}' has buckets smaller than the effective batch size "
            f"E = {eff.describe()}.",
            f"  It has {samples} samples and {samples * copies} occurrences per epoch "
            f"(repeats {spec.repeats}) in {len(sizes)} buckets; each bucket needs at least "
            f"{e} occurrences.",
        ]
        for key, n in bad.items():
            need = math.ceil(e / n) - 1
            named = ", ".join(map(printable, sorted(spec.buckets[key])[:NAMED_PER_BUCKET]))
            more = f" and {n - NAMED_PER_BUCKET} more" if n > NAMED_PER_BUCKET else ""
            lines.append(f"  bucket {key}: {n} samples x {copies} = {n * copies} occurrences; "
                         f"needs repeats >= {need} ({named}{more})")
        if spec.allow_oversubscription and spec.repeats > 0:
            lines.append(f"  allow_dataset_oversubscription is on but does not apply: 'repeats' "
                         f"is set by hand ({spec.repeats}).")
        failures.append("\n".join(lines))
    if failures:
        fixes = ("Fixes: a smaller train_batch_size (config.json or the dataset's override), "
                 "fewer gradient_accumulation_steps, fewer processes, a larger 'repeats' for the "
                 "dataset in multidatabackend.json, more images in these buckets, or "
                 "allow_dataset_oversubscription: true in config.json (it extends only undersized "
                 "buckets, and only for datasets without manual 'repeats').")
        raise UndersizedBucketsError("\n".join(failures + [fixes]))
    return notes


@dataclass(frozen=True, eq=False)
class BucketSlice:
    """One rank's share of one bucket in one epoch.

    It holds positions, not ids: the ids of micro-batch j are looked up when it is asked for,
    so a rank never builds a list of its whole share (a million-sample bucket costs a few MiB
    of int64 here, and no pass over its id strings).
    """

    dataset_id: str
    bucket: str
    epoch: int
    batch_size: int             # samples per micro-batch
    occurrences: np.ndarray     # canonical occurrence indices of this rank, micro-batch order
    ids: SortedIds              # the bucket, canonical
    repeats: int
    trimmed: list[str]          # one entry per trimmed occurrence; identical on every rank
    counts: BucketCounts

    @property
    def micro_batches(self) -> int:
        return len(self.occurrences) // self.batch_size

    def micro_batch(self, j: int) -> list[str]:
        chosen = self.occurrences[j * self.batch_size:(j + 1) * self.batch_size]
        return _ids_of(self.ids, chosen, self.counts, self.repeats)

    @property
    def samples(self) -> list[str]:
        """Every sample id of this rank's share in order (micro-batch j is
        samples[j*batch_size:(j+1)*batch_size]); built on each call."""
        return _ids_of(self.ids, self.occurrences, self.counts, self.repeats)


class SortedIds(list):
    """Sample ids in canonical order (sorted, each once), which the split takes as they are.

    Every ``DatasetIndex`` bucket is one (see ``canonical_ids``), so a rank checks the order
    once, where the index is made, not in every epoch's split; where a bucket is built in sorted
    order (``refresh_index`` walks a sorted listing) it is never checked at all. With ids
    scattered in memory the check was most of a rank's split time (benchmarks/bench_split.py).
    Treat it as read-only.
    """


def canonical_ids(sample_ids: Sequence[str]) -> SortedIds:
    """``sample_ids`` in canonical order; a SortedIds is returned as it is.

    The pairwise checks run in C (map over operator functions): a Python-level loop here was
    most of a rank's split time at a million samples (benchmarks/bench_split.py)."""
    if isinstance(sample_ids, SortedIds):
        return sample_ids
    if all(map(operator.lt, sample_ids, islice(sample_ids, 1, None))):
        return SortedIds(sample_ids)
    ordered = SortedIds(sorted(sample_ids))
    if any(map(operator.eq, ordered, islice(ordered, 1, None))):
        raise ValueError("a bucket lists the same sample id twice")
    return ordered


def _ids_of(ids: Sequence[str], occurrences: np.ndarray, counts: BucketCounts,
            repeats: int) -> list[str]:
    """Canonical occurrence o is sample o // (repeats+1); an extended bucket cycles: o % n."""
    index = occurrences % len(ids) if counts.extended else occurrences // (repeats + 1)
    return list(map(ids.__getitem__, index.tolist()))  # a C loop: faster than a comprehension


def split_bucket(sample_ids: Sequence[str], *, dataset_id: str, bucket: str, epoch: int,
                 seed: int, repeats: int, effective: EffectiveBatch, rank: int,
                 allow_oversubscription: bool = False) -> BucketSlice:
    """This rank's slice of one bucket for one epoch, plus the bucket's trimmed occurrences."""
    if not 0 <= rank < effective.processes:
        raise ValueError(f"rank {rank} is outside 0..{effective.processes - 1}")
    ids = canonical_ids(sample_ids)
    counts = bucket_counts(len(ids), repeats, effective, allow_oversubscription)
    shuffle = StableShuffle(counts.occurrences, seed, dataset_id, bucket, epoch)
    b, w = effective.batch_size, effective.processes
    # Shuffled positions laid out as (micro-batch, rank, batch): this rank's are j*B*W + rank*B + t.
    steps = np.arange(counts.kept // (b * w), dtype=np.int64)[:, None] * (b * w)
    mine = (steps + rank * b + np.arange(b, dtype=np.int64)).ravel()
    trimmed = shuffle.at(np.arange(counts.kept, counts.occurrences, dtype=np.int64))
    return BucketSlice(
        dataset_id=dataset_id,
        bucket=bucket,
        epoch=epoch,
        batch_size=b,
        occurrences=shuffle.at(mine),
        ids=ids,
        repeats=repeats,
        trimmed=_ids_of(ids, trimmed, counts, repeats),
        counts=counts,
    )


def split_dataset(spec: DatasetSpec, *, seed: int, epoch: int, processes: int, rank: int,
                  accumulation: int) -> dict[str, BucketSlice]:
    """This rank's slice of every bucket of one dataset, by bucket key in sorted order."""
    effective = spec.effective_batch(processes, accumulation)
    return {key: split_bucket(spec.buckets[key], dataset_id=spec.dataset_id, bucket=key,
                              epoch=epoch, seed=seed, repeats=spec.repeats, effective=effective,
                              rank=rank, allow_oversubscription=spec.allow_oversubscription)
            for key in sorted(spec.buckets)}
