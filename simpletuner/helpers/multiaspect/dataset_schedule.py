"""When each dataset joins the lockstep schedule, and how often its buckets are drawn: pure.

SimpleTuner's dataset keys, with its meanings:

- ``start_epoch`` (1 = the first epoch, epoch 0 of the trace) and ``start_step`` (an optimizer
  step counted from 1; 0 or 1 = the first): a dataset is drawn only from the epoch and the step
  where both hold. Epochs here are passes of every dataset that has joined, so a dataset that
  joins mid-epoch joins that epoch's remaining steps with its whole pass, and an epoch in which
  nothing can join before its other datasets run out ends there (as SimpleTuner's does).
- ``probability``: a relative weight. Each next group (one optimizer step) is drawn from the
  groups the epoch still holds, a group of dataset ``d`` with odds proportional to ``p_d``
  (Efraimidis-Spirakis keys: sorting exponential variates of rate ``p_d``). A low probability
  pushes a dataset's steps towards the end of the epoch; it never drops or repeats one, so every
  occurrence of a pass is still trained exactly once. With equal probabilities the order is the
  plain shuffle of the groups (the schedule of runs that set none).

Everything is decided from ``(seed, epoch)`` and the bucket sizes, epoch by epoch from epoch 0,
so every rank computes the same schedule and a resume recomputes it without replaying steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from simpletuner.configuration.errors import ConfigError
from simpletuner.helpers.metadata.permutation import stable_argsort, stable_permutation, stable_seed

_UNIT = 2.0 ** -53  # 53 random bits -> a float in (0, 1)


@dataclass(frozen=True)
class DatasetSchedule:
    """One training dataset's multidatabackend.json keys that place it in the schedule."""

    probability: float = 1.0
    start_epoch: int = 1  # SimpleTuner counts epochs from 1
    start_step: int = 0   # SimpleTuner's optimizer step, from 1; 0 and 1 mean the first

    @classmethod
    def of(cls, dataset) -> "DatasetSchedule":
        """From a DatasetConfig (start_epoch 0 is SimpleTuner's 1)."""
        return cls(dataset.probability, max(dataset.start_epoch, 1), dataset.start_step)

    def join_offset(self, epoch: int, steps_before: int) -> int | None:
        """Steps of ``epoch`` (0-based) that pass before this dataset may be drawn, with
        ``steps_before`` optimizer steps in the earlier epochs; None before its start epoch."""
        if epoch + 1 < self.start_epoch:
            return None
        return max(0, self.start_step - 1 - steps_before)

    def fingerprint(self) -> dict:
        """The keys that differ from the defaults (a run that sets none keeps its fingerprint)."""
        return {key: value for key, value in vars(self).items()
                if value != getattr(DatasetSchedule, key)}


@dataclass(frozen=True)
class EpochEntry:
    """Which datasets epoch ``epoch`` holds: dataset id -> the step of the epoch from which it
    is drawn (0 = from the start), and the epoch each of them first joined."""

    epoch: int
    steps_before: int | None     # optimizer steps of the earlier epochs (None once settled)
    joins: dict[str, int]
    first_epochs: dict[str, int]
    steps: int | None            # optimizer steps (groups) of this epoch (None once settled)


GroupsOf = Callable[[str, int, int], int]  # (dataset id, epoch, its first epoch) -> groups


class DatasetTimeline:
    """Epoch entries, worked out in order from epoch 0 until every dataset has joined (a few
    ints per epoch); from then on every epoch holds them all from its first step, so a resume
    at a late epoch replays nothing (the step counts of those epochs are not needed: None).

    ``groups_of`` gives a dataset's optimizer steps in an epoch, which with ``bucket_tail:
    carry`` depends on how many passes it trained before (its first epoch)."""

    def __init__(self, schedules: Mapping[str, DatasetSchedule], groups_of: GroupsOf):
        self.schedules = dict(sorted(schedules.items()))
        self.groups_of = groups_of
        self._entries: list[EpochEntry] = []

    def entry(self, epoch: int) -> EpochEntry:
        while len(self._entries) <= epoch and not self._settled():
            self._entries.append(self._next(self._entries[-1] if self._entries else None))
        if epoch < len(self._entries):
            return self._entries[epoch]
        last = self._entries[-1]
        return EpochEntry(epoch, None, dict.fromkeys(last.joins, 0), last.first_epochs, None)

    def _settled(self) -> bool:
        return bool(self._entries) and len(self._entries[-1].first_epochs) == len(self.schedules)

    def _next(self, previous: EpochEntry | None) -> EpochEntry:
        epoch = 0 if previous is None else previous.epoch + 1
        steps_before = 0 if previous is None else previous.steps_before + previous.steps
        first = {} if previous is None else dict(previous.first_epochs)
        offsets = {d: s.join_offset(epoch, steps_before) for d, s in self.schedules.items()}
        waiting = sorted((offset, d) for d, offset in offsets.items() if offset is not None)
        joins: dict[str, int] = {}
        steps = 0
        for offset, dataset_id in waiting:
            if dataset_id not in first and offset > steps:
                break  # the epoch runs out before this dataset (and any later one) may start
            joins[dataset_id] = 0 if dataset_id in first else offset
            first.setdefault(dataset_id, epoch)
            steps += self.groups_of(dataset_id, epoch, first[dataset_id])
        return EpochEntry(epoch, steps_before, joins, first, steps)

    def first_epoch_by(self, total_steps: int) -> dict[str, int | None]:
        """Each dataset's first epoch within ``total_steps`` optimizer steps (None: it never
        joins in time). Walks the epochs up to that step."""
        found: dict[str, int | None] = dict.fromkeys(self.schedules)
        epoch = 0
        while True:
            entry = self.entry(epoch)
            if entry.steps is None or entry.steps_before >= total_steps or entry.steps == 0:
                return found  # settled: every dataset that joins in time was found
            for dataset_id, offset in entry.joins.items():
                if found[dataset_id] is None and entry.steps_before + offset < total_steps:
                    found[dataset_id] = epoch
            if all(value is not None for value in found.values()):
                return found
            epoch += 1

    def check_every_dataset_joins(self, total_steps: int) -> None:
        """A dataset whose start comes after the run's last step would never be trained: a
        configuration error, found from the bucket sizes every rank has (so on every rank)."""
        late = [d for d, epoch in self.first_epoch_by(total_steps).items() if epoch is None]
        if late:
            raise ConfigError([
                f"dataset '{d}': start_epoch {self.schedules[d].start_epoch}, start_step "
                f"{self.schedules[d].start_step} come after the last of the {total_steps} "
                "optimizer steps, so it would never be trained; lower them or train longer "
                "(python -m simpletuner plan shows where each dataset joins)" for d in late])


def weighted_permutation(weights: np.ndarray, *parts: object) -> np.ndarray:
    """An order of ``range(len(weights))`` drawn one item at a time, each with odds
    proportional to its weight among those not drawn yet; fixed by ``parts``. Equal weights
    give ``stable_permutation`` itself."""
    n = len(weights)
    if n == 0 or np.all(weights == weights[0]):
        return stable_permutation(n, *parts)
    raw = np.random.PCG64(stable_seed("weighted", *parts)).random_raw(n)
    uniform = ((raw >> np.uint64(11)).astype(np.float64) + 0.5) * _UNIT
    return stable_argsort(-np.log(uniform) / weights)


def group_order(per_bucket: np.ndarray, weights: np.ndarray, joins: np.ndarray, *,
                seed: int, epoch: int) -> np.ndarray:
    """The bucket of each group (optimizer step) of ``epoch``. ``per_bucket``: each bucket's
    groups; ``weights``: its dataset's probability; ``joins``: the step from which its dataset
    is drawn. Between two join steps the groups still to come, with those of the datasets that
    joined, are ordered again by a permutation fixed by ``(seed, epoch, step)``."""
    steps = sorted({int(j) for j, n in zip(joins, per_bucket) if n})
    order: list[np.ndarray] = []
    pool = np.zeros(len(per_bucket), dtype=np.int64)
    done = 0
    for k, step in enumerate(steps):
        pool += np.where(joins == step, per_bucket, 0)
        canonical = np.repeat(np.arange(len(per_bucket)), pool)
        parts = ("schedule", seed, epoch) + ((step,) if k else ())
        drawn = canonical[weighted_permutation(weights[canonical], *parts)]
        upto = steps[k + 1] - done if k + 1 < len(steps) else len(drawn)
        order.append(drawn[:upto])
        pool -= np.bincount(drawn[:upto], minlength=len(per_bucket))
        done += upto
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)


def probability_share(schedules: Mapping[str, DatasetSchedule]) -> dict[str, float]:
    """Each dataset's probability as a share of their sum (what ``plan`` shows)."""
    total = math.fsum(s.probability for s in schedules.values())
    return {d: s.probability / total for d, s in schedules.items()}
