"""MultiAspectSampler: this rank's micro-batches, in lockstep with every other rank.

An epoch is a schedule of *groups*: ``accumulation`` consecutive micro-batches from one
(dataset, bucket), so an optimizer step never mixes resolutions. The schedule lists each bucket
once per group it can fill (the same number on every rank, see split.py) and is shuffled by an RNG
seeded from ``(seed, epoch)`` only, so all ranks draw micro-batch ``i`` from the same bucket.
With ``bucket_tail: carry`` a bucket fills one group more in some epochs than in others, so an
epoch's length depends on the epoch (``micro_batches_in``); it is the same on every rank.
Evaluation micro-batches that only keep a rank in step are marked ``stand_in``.
Position is ``(epoch, step)``; the plan is recomputed from the data, never stored, so the state
is a few hundred bytes at any dataset size. Besides the fingerprint it holds each dataset's
index cache digest, with which a resume on changed data names the files that changed
(index_history.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from simpletuner.helpers.metadata.buckets import parse_bucket_key
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.index_history import IndexVersion
from simpletuner.configuration.options import DEFAULT_BUCKET_TAIL, BucketTail
from simpletuner.helpers.metadata.epoch_counts import BucketCounts, bucket_counts
from simpletuner.helpers.metadata.split import (SPLIT_VERSION, BucketSlice, DatasetSpec,
                                                check_bucket_sizes, split_bucket)
from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
from simpletuner.helpers.multiaspect.captions import CaptionPolicy
from simpletuner.helpers.multiaspect.dataset_schedule import (SAMPLINGS, DatasetSchedule,
                                                              DatasetTimeline)

logger = logging.getLogger(__name__)
# Each epoch's split line: a training run sends these to a file (training/reporting/epoch_log.py).
EPOCH_LOGGER = f"{__name__}.epochs"

TRIMMED_BUCKETS_NAMED = 20  # per epoch's log line; the rest are counted


class NoDatasetError(ValueError):
    """The configuration has no dataset of the kind a sampler was asked for."""


@dataclass(frozen=True)
class SamplerDataset:
    """One dataset as the sampler sees it: its index and the settings that shape the split."""

    index: DatasetIndex
    caption_for: Callable[[str], str]
    batch_size: int                 # the dataset's train_batch_size override, else the global one
    repeats: int = 0
    evaluation: bool = False
    allow_oversubscription: bool = False
    captions: CaptionPolicy = CaptionPolicy()  # which caption of the read text, per epoch
    bucket_tail: BucketTail = DEFAULT_BUCKET_TAIL
    schedule: DatasetSchedule = DatasetSchedule()  # probability, start and end
    version: IndexVersion | None = None  # the index cache it came from; names changed files

    @property
    def spec(self) -> DatasetSpec:
        return DatasetSpec(self.index.dataset_id, self.index.buckets, self.repeats,
                           self.batch_size, self.evaluation, self.allow_oversubscription,
                           self.bucket_tail)


def _changes(old: Any, new: Any, path: str = "") -> list[str]:
    """Human-readable differences between two fingerprints, e.g. 'processes: 4 -> 2'."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in new:
                found.append(f"{where} removed")
            elif key not in old:
                found.append(f"{where} added")
            else:
                found.extend(_changes(old[key], new[key], where))
        return found
    return [] if old == new else [f"{path}: {old} -> {new}"]


class MultiAspectSampler:
    """Iterate this rank's micro-batches; ``len()`` (the current epoch's) is the same on every
    rank."""

    def __init__(self, datasets: Sequence[SamplerDataset], *, seed: int, processes: int,
                 rank: int, accumulation: int, evaluation: bool = False,
                 sampling: str = SAMPLINGS[0], context_parallel: int = 1):
        """``processes`` and ``rank``: the data-parallel groups and this rank's group (with
        ``context_parallel`` C above 1 the C ranks of a group get the same micro-batches;
        helpers/metadata/mesh.py)."""
        chosen = [d for d in datasets if d.evaluation == evaluation]
        if not chosen:
            kind = "evaluation" if evaluation else "training"
            raise NoDatasetError(f"no {kind} dataset to sample from: add one to the dataset "
                                 "file (multidatabackend.json) or set 'disabled': false")
        self.datasets = sorted(chosen, key=lambda d: d.index.dataset_id)
        self._by_id = {d.index.dataset_id: d for d in self.datasets}
        self.seed = seed
        self.processes = processes
        self.rank = rank
        self.context_parallel = context_parallel
        # Evaluation steps one sample per rank, without accumulation (see EffectiveBatch).
        self.accumulation = 1 if evaluation else accumulation
        self.evaluation = evaluation
        self.sampling = sampling  # data_backend_sampling (dataset_schedule.py)
        # Same data on every rank, so an undersized bucket raises the same error everywhere.
        self.notes = check_bucket_sizes([d.spec for d in self.datasets], processes, accumulation)
        self.buckets = [(d, key) for d in self.datasets for key in sorted(d.index.buckets)]
        self.timeline = DatasetTimeline({d.index.dataset_id: d.schedule for d in self.datasets},
                                        self._dataset_groups, seed=seed, sampling=sampling)
        self._counts_by_epoch: dict[int, list[BucketCounts]] = {}
        self.epoch = 0
        self.step = 0
        self._cache_epoch: int | None = None
        self._cache: dict[int, BucketSlice] = {}
        self._schedule: tuple[np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.micro_batches_in(self.epoch)

    def micro_batches_in(self, epoch: int) -> int:
        """This rank's micro-batches in ``epoch``; the same on every rank. A dataset that ends
        within the epoch (end_step) leaves the rest of its groups out of it."""
        entry = self.timeline.entry(epoch)
        if entry.leaves:
            return entry.steps * self.accumulation
        return sum(c.micro_batches for c in self.counts(epoch))

    def counts(self, epoch: int) -> list[BucketCounts]:
        """Each bucket's arithmetic in ``epoch``, in ``self.buckets`` order (pure). Kept for the
        last two epochs asked for: the loop and its read-ahead ask every micro-batch."""
        if epoch not in self._counts_by_epoch:
            if len(self._counts_by_epoch) >= 2:
                self._counts_by_epoch.clear()
            entry = self.timeline.entry(epoch)
            self._counts_by_epoch[epoch] = [
                self._bucket_counts(d, key, epoch, entry.first_epochs.get(d.index.dataset_id),
                                    joined=d.index.dataset_id in entry.joins)
                for d, key in self.buckets]
        return self._counts_by_epoch[epoch]

    def _bucket_counts(self, d: SamplerDataset, key: str, epoch: int, first_epoch: int | None,
                       joined: bool = True) -> BucketCounts:
        """A dataset that has not joined the schedule yet has nothing in the epoch."""
        counts = bucket_counts(len(d.index.buckets[key]), d.repeats,
                               d.spec.effective_batch(self.processes, self.accumulation),
                               tail=d.bucket_tail, epoch=epoch, first_epoch=first_epoch or 0,
                               allow_oversubscription=d.allow_oversubscription)
        return counts if joined else replace(counts, carried_in=0, kept=0, trimmed=0,
                                             carried_out=0)

    def _dataset_groups(self, dataset_id: str, epoch: int, first_epoch: int) -> list[int]:
        """Each bucket's optimizer steps in ``epoch`` once the dataset has joined (for the
        timeline)."""
        d = self._by_id[dataset_id]
        return [self._bucket_counts(d, key, epoch, first_epoch).optimizer_steps
                for key in sorted(d.index.buckets)]

    def fingerprint(self) -> dict:
        """Everything that decides the plan; plain JSON so a mismatch can name what changed."""
        return {
            "split_version": SPLIT_VERSION,
            "processes": self.processes,
            # Only above 1, so the fingerprints of runs without context parallel stay as saved.
            **({"context_parallel": self.context_parallel} if self.context_parallel > 1 else {}),
            "accumulation": self.accumulation,
            "seed": self.seed,
            "evaluation": self.evaluation,
            # only when not the default: a run that sets none keeps its fingerprint
            **({} if self.sampling == SAMPLINGS[0] else {"sampling": self.sampling}),
            "datasets": {
                d.index.dataset_id: {
                    "batch_size": d.batch_size,
                    "repeats": d.repeats,
                    "allow_oversubscription": d.allow_oversubscription,
                    "bucket_tail": d.bucket_tail,
                    "index": d.index.digest(),  # once per index (index.py)
                    **d.schedule.fingerprint(),
                }
                for d in self.datasets
            },
        }

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "fingerprint": self.fingerprint(),
                "data": {d.index.dataset_id: d.version.digest for d in self.datasets
                         if d.version is not None}}

    def load_state_dict(self, state: dict) -> None:
        """Continue at the saved position. A different plan is warned about, never adapted to."""
        changed = _changes(state.get("fingerprint"), self.fingerprint())
        if changed:
            if self.rank == 0:  # the main rank names the files: it reads the old caches
                changed += self._changed_files(state.get("data") or {})
            logger.warning(
                "Resuming with different data settings (%s). Resume across changes of topology "
                "or dataloader settings is not supported (see AGENTS.md); the position is kept "
                "as saved and the sample sequence will differ from the original run.",
                "; ".join(changed))
        self.epoch = int(state["epoch"])
        self.step = int(state["step"])

    def _changed_files(self, saved: dict[str, str]) -> list[str]:
        return [line for d in self.datasets if d.version is not None
                and saved.get(d.index.dataset_id) not in (None, d.version.digest)
                for line in d.version.history.changes_since(saved[d.index.dataset_id])]

    def __iter__(self) -> Iterator[MicroBatch]:
        """The rest of the current epoch; ``step`` counts micro-batches already handed out."""
        return self._walk(self.micro_batch)

    def plans(self) -> Iterator[MicroBatch]:
        """As iteration, position included, but without captions: for a caller that resolves
        them on another thread (prefetch.py), so this one reads no caption."""
        return self._walk(self.plan)

    def _walk(self, at: Callable[[int, int], MicroBatch]) -> Iterator[MicroBatch]:
        epoch = self.epoch
        total = self.micro_batches_in(epoch)
        if self.rank == 0 and self.step < total:  # the main rank speaks for all
            report = self.tail_report(epoch)
            if report:
                logging.getLogger(EPOCH_LOGGER).info(report)
        while self.step < total:
            batch = at(epoch, self.step)
            self.step += 1
            yield batch
        self.epoch, self.step = epoch + 1, 0

    def tail_report(self, epoch: int) -> str:
        """What the split does this epoch with each bucket's leftover (what fills no whole
        effective batch): trimmed, or carried into the next epoch (bucket_tail), and how many
        carried from the previous epoch train first. Which occurrences changes with the epoch.
        Empty when there is nothing to say: with bucket_tail 'carry' everywhere and no remainder."""
        kind = "evaluation epoch" if self.evaluation else "epoch"
        counts = self.counts(epoch)
        parts = [f"the split {verb} {n} occurrences (each bucket's remainder below a multiple of "
                 f"the effective batch){where} from {buckets}"
                 for verb, where, (n, buckets) in (
                     ("trims", "", self._per_bucket(counts, "trimmed")),
                     ("carries", f" into epoch {epoch + 1}",
                      self._per_bucket(counts, "carried_out"))) if n]
        carried_in = sum(c.carried_in for c in counts)
        if carried_in:
            parts.append(f"{carried_in} occurrences carried from epoch {epoch - 1} train first")
        entry = self.timeline.entry(epoch)
        parts += [f"dataset '{d}' joins the schedule at step {step + 1} of the epoch"
                  for d, step in entry.joins.items()
                  if entry.first_epochs[d] == epoch and (epoch or step)]  # start_epoch/_step
        parts += [f"dataset '{d}' leaves the schedule after step {step} of the epoch (end_step "
                  "or end_epoch; the rest of its pass is not trained)"
                  for d, step in entry.leaves.items()]
        if not parts and all(d.bucket_tail == "carry" for d in self.datasets):
            return ""  # carry never trims: nothing happened worth a line
        return f"{kind} {epoch}: " + ("; ".join(parts) or "the split trims nothing")

    def _per_bucket(self, counts: list[BucketCounts], field: str) -> tuple[int, str]:
        """The total of one count over the buckets, and the buckets where it is not 0."""
        found = [(d.index.dataset_id, key, getattr(c, field))
                 for (d, key), c in zip(self.buckets, counts) if getattr(c, field)]
        named = found[:TRIMMED_BUCKETS_NAMED]
        buckets = ", ".join(f"{dataset_id} {key}: {n}" for dataset_id, key, n in named)
        more = f" and {len(found) - len(named)} more buckets" if len(found) > len(named) else ""
        return sum(n for *_, n in found), f"{len(found)} buckets: {buckets}{more}"

    def micro_batch(self, epoch: int, step: int) -> MicroBatch:
        """Micro-batch ``step`` of ``epoch``, each sample with its caption for the epoch."""
        return self.with_captions(self.plan(epoch, step))

    def plan(self, epoch: int, step: int) -> MicroBatch:
        """Micro-batch ``step`` of ``epoch`` with captions None: which samples, no caption read."""
        groups, ordinals = self._epoch_schedule(epoch)
        group, offset = divmod(step, self.accumulation)
        which = int(groups[group])
        piece = self._slice(epoch, which)
        dataset, key = self.buckets[which]
        j = int(ordinals[group]) * self.accumulation + offset
        size = parse_bucket_key(key)
        references = dataset.index.references
        samples = tuple(BatchSample(dataset.index.dataset_id, sample_id, key, size, None,
                                    references.get(sample_id, ()))
                        for sample_id in piece.micro_batch(j))
        return MicroBatch(epoch, step, dataset.index.dataset_id, key, samples,
                          stand_in=piece.is_stand_in(j))

    def with_captions(self, planned: MicroBatch) -> MicroBatch:
        """``planned`` with each sample's caption for its epoch (reads the caption files)."""
        dataset = self._by_id[planned.dataset_id]
        return replace(planned, samples=tuple(
            replace(s, caption=self._caption(dataset, s.sample_id, planned.epoch))
            for s in planned.samples))

    def _caption(self, dataset: SamplerDataset, sample_id: str, epoch: int) -> str:
        return dataset.captions.choose(dataset.caption_for(sample_id), seed=self.seed,
                                       dataset_id=dataset.index.dataset_id, sample_id=sample_id,
                                       epoch=epoch)

    def slices(self, epoch: int) -> list[BucketSlice]:
        """This rank's slice of every bucket in ``epoch`` of the datasets it holds (each slice
        holds the bucket's trimmed or carried occurrences)."""
        joins = self.timeline.entry(epoch).joins
        return [self._slice(epoch, i) for i, (d, _) in enumerate(self.buckets)
                if d.index.dataset_id in joins]

    def _split(self, dataset: SamplerDataset, key: str, epoch: int) -> BucketSlice:
        """Only asked for the datasets the epoch holds."""
        spec = dataset.spec
        first_epoch = self.timeline.entry(epoch).first_epochs[spec.dataset_id]
        return split_bucket(spec.buckets[key], dataset_id=spec.dataset_id, bucket=key,
                            epoch=epoch, seed=self.seed, repeats=spec.repeats,
                            effective=spec.effective_batch(self.processes, self.accumulation),
                            rank=self.rank, tail=spec.bucket_tail,
                            allow_oversubscription=spec.allow_oversubscription,
                            first_epoch=first_epoch)

    def _use_epoch(self, epoch: int) -> None:
        if self._cache_epoch != epoch:
            self._cache_epoch, self._cache, self._schedule = epoch, {}, None

    def _slice(self, epoch: int, which: int) -> BucketSlice:
        self._use_epoch(epoch)
        if which not in self._cache:
            dataset, key = self.buckets[which]
            self._cache[which] = self._split(dataset, key, epoch)
        return self._cache[which]

    def _epoch_schedule(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Per group: which bucket, and how many earlier groups of the epoch used that bucket.
        Each dataset's groups are drawn with its probability, from the step it joins at to the
        step it leaves at (dataset_schedule.py)."""
        self._use_epoch(epoch)
        if self._schedule is None:
            groups = self.timeline.epoch_order(epoch)
            per_bucket = np.bincount(groups, minlength=len(self.buckets))  # an end cuts some
            by_bucket = np.argsort(groups, kind="stable")
            first = np.cumsum(per_bucket) - per_bucket
            ordinals = np.empty_like(groups)
            ordinals[by_bucket] = np.arange(len(groups)) - first[groups[by_bucket]]
            self._schedule = (groups, ordinals)
        return self._schedule
