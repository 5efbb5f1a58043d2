"""Which occurrence of which sample goes to which rank: pure functions of plain data.

Every rank calls these with the same inputs and gets its own part of one shared answer:

1. A bucket's occurrences are put in a canonical order (sample ids sorted, each id ``repeats+1``
   times in a row), so listing order, cache order and ``PYTHONHASHSEED`` cannot matter.
2. A permutation of occurrence *indices* fixed by a SHA digest of ``(seed, dataset id, bucket,
   epoch)`` (permutation.py; no copy of the id list) is evaluated at this rank's positions only;
   the global random/numpy/torch RNGs are never used. With ``bucket_tail: carry`` an epoch's
   order is the previous pass's leftover followed by this pass (epoch_counts.py).
3. The leftover beyond a multiple of the effective batch ``E = batch x processes x
   accumulation`` is trimmed (``bucket_tail: trim``) or carried into the next epoch (``carry``),
   and reported; which occurrences it holds changes with the epoch because the permutation does.
4. Kept occurrences are laid out as ``(micro-batch, rank, batch)``: micro-batch ``j`` of every
   rank comes from positions ``j*B*W .. (j+1)*B*W``, and rank ``w`` takes its ``B`` of them. So
   each optimizer step's ``E`` occurrences are consecutive in the epoch's order, and every rank
   gets the same number of micro-batches, a multiple of the accumulation steps.
5. Evaluation datasets keep every occurrence (one per rank per micro-batch): a rank whose
   position in the bucket's last step is past its end gets a stand-in, a micro-batch that runs
   like any other but is not counted, so ranks stay in lockstep over sets of any size.

Nothing here calls torch.distributed; a test can run every rank in one process.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from dataclasses import dataclass
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice

import numpy as np

from simpletuner.common.names import printable
from simpletuner.configuration.options import DEFAULT_BUCKET_TAIL, BucketTail
from simpletuner.helpers.metadata.epoch_counts import BucketCounts, EffectiveBatch, bucket_counts
from simpletuner.helpers.metadata.permutation import StableShuffle


# Which samples go where changes with this; a sampler state saved under another version is
# warned about on resume. 2: buckets of 65 536+ occurrences shuffle with a Feistel network.
# 3: evaluation datasets keep every occurrence (stand-ins keep the ranks in lockstep).
SPLIT_VERSION = 3
NAMED_PER_BUCKET = 3  # an undersized bucket names its first files: often one odd image


class UndersizedBucketsError(ValueError):
    """A bucket holds fewer occurrences than one effective batch; the message lists the fixes."""


@dataclass(frozen=True)
class DatasetSpec:
    """What the split needs to know about one dataset; the same on every rank."""

    dataset_id: str
    buckets: Mapping[str, Sequence[str]]   # "WxH" -> sample ids (any order)
    repeats: int = 0
    batch_size: int = 1                    # the dataset's train_batch_size (override or global)
    evaluation: bool = False
    allow_oversubscription: bool = False
    bucket_tail: BucketTail = DEFAULT_BUCKET_TAIL  # training datasets only

    def effective_batch(self, processes: int, accumulation: int) -> EffectiveBatch:
        return EffectiveBatch.for_dataset(self.batch_size, processes, accumulation, self.evaluation)


def check_bucket_sizes(datasets: Sequence[DatasetSpec], processes: int,
                       accumulation: int) -> list[str]:
    """Raise one error for every bucket too small to fill an effective batch, across datasets.

    Returns report lines for buckets that oversubscription extended. Every rank has the same
    data, so every rank raises the same message (no rank is left in a collective).
    """
    failures: list[str] = []
    notes: list[str] = []
    undersized = False
    for spec in datasets:
        eff = spec.effective_batch(processes, accumulation)
        e = eff.total
        sizes = {key: len(ids) for key, ids in sorted(spec.buckets.items())}
        if not sizes or sum(sizes.values()) == 0:
            failures.append(f"Dataset '{spec.dataset_id}' has no usable samples; check its "
                            "instance_data_dir and the skipped-file report of `plan`.")
            continue
        bad = {}
        for key, n in sizes.items():
            counts = bucket_counts(n, spec.repeats, eff, tail=spec.bucket_tail,
                                   allow_oversubscription=spec.allow_oversubscription)
            if counts.extended:
                notes.append(f"dataset '{spec.dataset_id}' bucket {key}: {n} samples extended "
                             f"cyclically to {e} occurrences per epoch "
                             "(allow_dataset_oversubscription)")
            elif counts.kept == 0:
                bad[key] = n
        if bad:
            failures.append(_undersized_report(spec, sizes, bad, eff))
            undersized = True
    if failures:
        # The fixes are for buckets too small; an empty dataset's own line says what to check.
        raise UndersizedBucketsError("\n".join(failures + [UNDERSIZED_FIXES] * undersized))
    return notes


UNDERSIZED_FIXES = (
    "Fixes: a smaller train_batch_size (config.json or the dataset's override), fewer "
    "gradient_accumulation_steps, fewer processes, a larger 'repeats' for the dataset in "
    "multidatabackend.json, more images in these buckets, or allow_dataset_oversubscription: "
    "true in config.json (it extends only undersized buckets, and only for datasets without "
    "manual 'repeats').")


def _undersized_report(spec: DatasetSpec, sizes: dict[str, int], bad: dict[str, int],
                       eff: EffectiveBatch) -> str:
    e, copies = eff.total, spec.repeats + 1
    samples = sum(sizes.values())
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
    return "\n".join(lines)


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
    counted: int                # the first `counted` are this rank's share, the rest stand-ins
    ids: SortedIds              # the bucket, canonical
    repeats: int
    trimmed: list[str]          # one entry per trimmed occurrence; identical on every rank
    carried: list[str]          # left to open the next epoch (bucket_tail carry); the same
    counts: BucketCounts

    @property
    def micro_batches(self) -> int:
        return len(self.occurrences) // self.batch_size

    def micro_batch(self, j: int) -> list[str]:
        chosen = self.occurrences[j * self.batch_size:(j + 1) * self.batch_size]
        return _ids_of(self.ids, chosen, self.counts, self.repeats)

    def is_stand_in(self, j: int) -> bool:
        """Whether micro-batch j only keeps this rank in step (evaluation: one sample each, so
        a micro-batch is either counted whole or a stand-in)."""
        return j * self.batch_size >= self.counted

    @property
    def samples(self) -> list[str]:
        """Every sample id of this rank's share in order, stand-ins left out (micro-batch j is
        samples[j*batch_size:(j+1)*batch_size]); built on each call."""
        return _ids_of(self.ids, self.occurrences[:self.counted], self.counts, self.repeats)


class SortedIds(Sequence):
    """Sample ids in canonical order (sorted, each once), which the split takes as they are.

    Every ``DatasetIndex`` bucket is one (see ``canonical_ids``), so a rank checks the order
    once, where the index is made, not in every epoch's split; where a bucket is built in sorted
    order (``refresh_index`` walks a sorted listing) it is never checked at all. With ids
    scattered in memory the check was most of a rank's split time (benchmarks/bench_split.py).
    Read-only. This one holds a list of str; a loaded index's are memory-mapped columns whose
    ids are decoded only when asked for (index_columns.MappedIds), since the split and the
    sampler need the ids of a few micro-batches, not of millions of samples.
    """

    def __init__(self, ids: Iterable[str] = ()):
        self._ids = list(ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, at):
        return self._ids[at]

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __contains__(self, sample_id) -> bool:
        # sorted: a bisection, not a scan
        at = bisect_left(self, sample_id)
        return at < len(self) and self[at] == sample_id

    def __eq__(self, other) -> bool:
        if not isinstance(other, (SortedIds, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None  # like a list's

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self[:5])!r}{' ...' if len(self) > 5 else ''})"

    def without(self, removed: Mapping[str, object]) -> "SortedIds":
        """These ids less ``removed``, still in canonical order."""
        return SortedIds(s for s in self if s not in removed)

    def plain_joined(self, separator: bytes) -> bytes | None:
        """The ids joined by ``separator`` in ASCII where a stored form gives that faster than
        the ids do and none needs escaping in JSON; None here (a list of str)."""
        return None


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


class _EpochOrder:
    """An epoch's order of a bucket's occurrences, at chosen positions: the previous pass's
    carried leftover first (bucket_tail carry), then this epoch's pass. Of the previous pass
    only its last ``front`` values are computed."""

    def __init__(self, counts: BucketCounts, seed: int, dataset_id: str, bucket: str,
                 epoch: int):
        self.front = counts.carried_in
        self.this_pass = StableShuffle(counts.occurrences, seed, dataset_id, bucket, epoch)
        # The previous pass's last `front` positions: the leftover it could not train.
        self.carried = StableShuffle.tail(counts.occurrences, self.front, seed, dataset_id,
                                          bucket, epoch - 1)

    def at(self, positions: np.ndarray) -> np.ndarray:
        if not self.front:
            return self.this_pass.at(positions)
        values = np.empty(len(positions), dtype=np.int64)
        early = positions < self.front
        values[early] = self.carried[positions[early]]
        values[~early] = self.this_pass.at(positions[~early] - self.front)
        return values


def split_bucket(sample_ids: Sequence[str], *, dataset_id: str, bucket: str, epoch: int,
                 seed: int, repeats: int, effective: EffectiveBatch, rank: int,
                 tail: BucketTail, allow_oversubscription: bool = False,
                 first_epoch: int = 0) -> BucketSlice:
    """This rank's slice of one bucket for one epoch, plus the bucket's trimmed or carried
    occurrences; ``first_epoch``: the epoch its dataset joined the schedule."""
    if not 0 <= rank < effective.processes:
        raise ValueError(f"rank {rank} is outside 0..{effective.processes - 1}")
    ids = canonical_ids(sample_ids)
    counts = bucket_counts(len(ids), repeats, effective, tail=tail, epoch=epoch,
                           first_epoch=first_epoch, allow_oversubscription=allow_oversubscription)
    order = _EpochOrder(counts, seed, dataset_id, bucket, epoch)
    b, w = effective.batch_size, effective.processes
    # Positions laid out as (micro-batch, rank, batch): this rank's are j*B*W + rank*B + t.
    steps = np.arange(counts.micro_batches, dtype=np.int64)[:, None] * (b * w)
    mine = (steps + rank * b + np.arange(b, dtype=np.int64)).ravel()
    # Evaluation only: positions past the bucket's end cycle back to its start (stand-ins).
    within = mine % max(counts.kept, 1)
    leftover = _ids_of(ids, order.at(np.arange(counts.kept, counts.kept + counts.leftover,
                                               dtype=np.int64)), counts, repeats)
    return BucketSlice(
        dataset_id=dataset_id,
        bucket=bucket,
        epoch=epoch,
        batch_size=b,
        occurrences=order.at(within),
        counted=int(np.count_nonzero(mine < counts.kept)),
        ids=ids,
        repeats=repeats,
        trimmed=leftover if counts.trimmed else [],
        carried=leftover if counts.carried_out else [],
        counts=counts,
    )


def split_dataset(spec: DatasetSpec, *, seed: int, epoch: int, processes: int, rank: int,
                  accumulation: int, first_epoch: int = 0) -> dict[str, BucketSlice]:
    """This rank's slice of every bucket of one dataset, by bucket key in sorted order."""
    effective = spec.effective_batch(processes, accumulation)
    return {key: split_bucket(spec.buckets[key], dataset_id=spec.dataset_id, bucket=key,
                              epoch=epoch, seed=seed, repeats=spec.repeats, effective=effective,
                              rank=rank, tail=spec.bucket_tail,
                              allow_oversubscription=spec.allow_oversubscription,
                              first_epoch=first_epoch)
            for key in sorted(spec.buckets)}
