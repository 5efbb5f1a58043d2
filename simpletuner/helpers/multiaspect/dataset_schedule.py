"""When each dataset joins the lockstep schedule, and how often its buckets are drawn: pure.

SimpleTuner's dataset keys, with its meanings:

- ``start_epoch`` (1 = the first epoch, epoch 0 of the trace) and ``start_step`` (an optimizer
  step counted from 1; 0 or 1 = the first): a dataset is drawn only from the epoch and the step
  where both hold. Epochs here are passes of every dataset that has joined, so a dataset that
  joins mid-epoch joins that epoch's remaining steps with its whole pass, and an epoch in which
  nothing can join before its other datasets run out ends there (as SimpleTuner's does).
- ``end_epoch`` (the last epoch, from 1) and ``end_step`` (the last optimizer step, from 1;
  null or 0: no end): a dataset is no longer drawn after either. A dataset that ends mid-epoch
  leaves that epoch's remaining steps, which are drawn again from what the others still hold;
  the rest of its pass is never trained (the audit reports it as ended).
- ``probability``: a relative weight, used as config.json's ``data_backend_sampling`` says
  (SimpleTuner's two methods). Each next group (one optimizer step) is drawn from the groups
  the epoch still holds:
  - ``auto-weighting`` (the default): a group of dataset ``d`` with odds proportional to
    ``p_d``, so dataset ``d`` with odds ``p_d`` x its groups still held: datasets mix in
    proportion to their size (Efraimidis-Spirakis keys: sorting exponential variates of rate
    ``p_d``). With equal probabilities the order is the plain shuffle of the groups (the
    schedule of runs that set none).
  - ``uniform``: dataset ``d`` with odds ``p_d`` among the datasets that still hold groups,
    whatever their size, its groups in a shuffled order (each dataset a Poisson clock of rate
    ``p_d``, merged by time): a small dataset's steps come early and it runs out first.
  Neither drops nor repeats a group, so every occurrence of a pass is still trained exactly
  once; a low probability pushes a dataset's steps towards the end of the epoch.

Everything is decided from ``(seed, epoch)`` and the bucket sizes, epoch by epoch from epoch 0,
so every rank computes the same schedule and a resume recomputes it without replaying steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from simpletuner.configuration.errors import ConfigError
from simpletuner.helpers.metadata.permutation import stable_argsort, stable_permutation, stable_seed

_UNIT = 2.0 ** -53  # 53 random bits -> a float in (0, 1)
SAMPLINGS = ("auto-weighting", "uniform")  # config.json's data_backend_sampling
NEVER = np.iinfo(np.int64).max  # a leave step: the dataset is drawn to the epoch's end


@dataclass(frozen=True)
class DatasetSchedule:
    """One training dataset's multidatabackend.json keys that place it in the schedule."""

    probability: float = 1.0
    start_epoch: int = 1  # SimpleTuner counts epochs from 1
    start_step: int = 0   # SimpleTuner's optimizer step, from 1; 0 and 1 mean the first
    end_epoch: int | None = None  # the last epoch it is drawn in (from 1); None: no end
    end_step: int | None = None   # the last optimizer step it is drawn at (from 1)

    @classmethod
    def of(cls, dataset) -> "DatasetSchedule":
        """From a DatasetConfig (start_epoch 0 is SimpleTuner's 1; an end of 0 is no end)."""
        return cls(dataset.probability, max(dataset.start_epoch, 1), dataset.start_step,
                   dataset.end_epoch or None, dataset.end_step or None)

    @property
    def ends(self) -> bool:
        return self.end_epoch is not None or self.end_step is not None

    def join_offset(self, epoch: int, steps_before: int) -> int | None:
        """Steps of ``epoch`` (0-based) that pass before this dataset may be drawn, with
        ``steps_before`` optimizer steps in the earlier epochs; None when it is not drawn in
        this epoch (before its start epoch, after its end)."""
        join = max(0, self.start_step - 1 - steps_before)
        leave = self.leave_offset(epoch, steps_before)
        if epoch + 1 < self.start_epoch or (leave is not None and leave <= join):
            return None
        return join

    def leave_offset(self, epoch: int, steps_before: int) -> int | None:
        """Steps of ``epoch`` (0-based) after which this dataset is no longer drawn (0: not in
        this epoch); None when it may be drawn to the epoch's end."""
        if self.end_epoch is not None and epoch + 1 > self.end_epoch:
            return 0
        if self.end_step is None:
            return None
        return max(0, self.end_step - steps_before)

    def fingerprint(self) -> dict:
        """The keys that differ from the defaults (a run that sets none keeps its fingerprint)."""
        return {key: value for key, value in vars(self).items()
                if value != getattr(DatasetSchedule, key)}


@dataclass(frozen=True)
class EpochEntry:
    """Which datasets epoch ``epoch`` holds: dataset id -> the step of the epoch from which it
    is drawn (0 = from the start), the epoch each of them first joined, and the step of the
    epoch from which each that ends within it is no longer drawn."""

    epoch: int
    steps_before: int | None     # optimizer steps of the earlier epochs (None once settled)
    joins: dict[str, int]
    first_epochs: dict[str, int]
    steps: int | None            # optimizer steps (groups) of this epoch (None once settled)
    leaves: dict[str, int] = field(default_factory=dict)


GroupsOf = Callable[[str, int, int], Sequence[int]]
"""(dataset id, epoch, its first epoch) -> each of its buckets' groups (buckets sorted)."""


class DatasetTimeline:
    """Epoch entries, worked out in order from epoch 0 until every dataset has joined and every
    dataset with an end has ended (a few ints per epoch); from then on every epoch holds the
    rest from its first step, so a resume at a late epoch replays nothing (the step counts of
    those epochs are not needed: None).

    ``groups_of`` gives a dataset's optimizer steps per bucket in an epoch, which with
    ``bucket_tail: carry`` depends on how many passes it trained before (its first epoch).
    An epoch's length is that of its group order, which an end within it shortens."""

    def __init__(self, schedules: Mapping[str, DatasetSchedule], groups_of: GroupsOf, *,
                 seed: int, sampling: str = SAMPLINGS[0]):
        self.schedules = dict(sorted(schedules.items()))
        self.groups_of = groups_of
        self.seed = seed
        self.sampling = sampling
        self._entries: list[EpochEntry] = []

    def entry(self, epoch: int) -> EpochEntry:
        while len(self._entries) <= epoch and not self._settled():
            self._entries.append(self._next(self._entries[-1] if self._entries else None))
        if epoch < len(self._entries):
            return self._entries[epoch]
        last = self._entries[-1]
        staying = [d for d in last.first_epochs if not self.schedules[d].ends]
        return EpochEntry(epoch, None, dict.fromkeys(staying, 0), last.first_epochs, None)

    def _settled(self) -> bool:
        if not self._entries:
            return False
        last = self._entries[-1]
        after = last.steps_before + last.steps
        return len(last.first_epochs) == len(self.schedules) and all(
            s.leave_offset(last.epoch + 1, after) == 0 for s in self.schedules.values() if s.ends)

    def _next(self, previous: EpochEntry | None) -> EpochEntry:
        epoch = 0 if previous is None else previous.epoch + 1
        steps_before = 0 if previous is None else previous.steps_before + previous.steps
        first = {} if previous is None else previous.first_epochs
        offsets = {d: s.join_offset(epoch, steps_before) for d, s in self.schedules.items()}
        joins = {d: 0 if d in first else offset for d, offset in offsets.items()
                 if offset is not None}
        leaves = {d: leave for d in joins
                  if (leave := self.schedules[d].leave_offset(epoch, steps_before)) is not None}
        steps = len(self._order(epoch, joins, leaves, {**dict.fromkeys(joins, epoch), **first}))
        joined = {d: offset for d, offset in joins.items() if offset <= steps}
        first = {**dict.fromkeys(joined, epoch), **first}
        leaves = {d: leave for d, leave in leaves.items() if d in joined and leave <= steps}
        return EpochEntry(epoch, steps_before, joined, first, steps, leaves)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The bucket of each group (optimizer step) of ``epoch``; buckets are numbered
        dataset by dataset (sorted ids), each dataset's buckets in sorted order."""
        entry = self.entry(epoch)
        return self._order(epoch, entry.joins, entry.leaves, entry.first_epochs)

    def _order(self, epoch: int, joins: Mapping[str, int], leaves: Mapping[str, int],
               first: Mapping[str, int]) -> np.ndarray:
        """group_order over every bucket; a dataset the epoch does not hold has no groups."""
        groups, weights, owners, join_steps, leave_steps = [], [], [], [], []
        for owner, (dataset_id, schedule) in enumerate(self.schedules.items()):
            per_bucket = self.groups_of(dataset_id, epoch, first.get(dataset_id, epoch))
            held = dataset_id in joins
            groups.extend(per_bucket if held else [0] * len(per_bucket))
            weights.extend([schedule.probability] * len(per_bucket))
            owners.extend([owner] * len(per_bucket))
            join_steps.extend([joins.get(dataset_id, -1)] * len(per_bucket))
            leave_steps.extend([leaves.get(dataset_id, NEVER)] * len(per_bucket))
        return group_order(np.array(groups, dtype=np.int64), np.array(weights),
                           np.array(join_steps, dtype=np.int64),
                           np.array(leave_steps, dtype=np.int64), seed=self.seed, epoch=epoch,
                           owners=np.array(owners, dtype=np.int64), sampling=self.sampling)

    def _walk(self, total_steps: int):
        """The entries from epoch 0 while they start within ``total_steps`` and are worked
        out (not settled), up to and with the first empty one."""
        epoch = 0
        while True:
            entry = self.entry(epoch)
            if entry.steps is None or entry.steps_before >= total_steps:
                return
            yield entry
            if entry.steps == 0:
                return
            epoch += 1

    def first_epoch_by(self, total_steps: int) -> dict[str, int | None]:
        """Each dataset's first epoch within ``total_steps`` optimizer steps (None: it never
        joins in time). Walks the epochs up to that step."""
        found: dict[str, int | None] = dict.fromkeys(self.schedules)
        for entry in self._walk(total_steps):
            for dataset_id, offset in entry.joins.items():
                if found[dataset_id] is None and entry.steps_before + offset < total_steps:
                    found[dataset_id] = entry.epoch
            if all(value is not None for value in found.values()):
                break
        return found

    def check_every_dataset_joins(self, total_steps: int) -> None:
        """A dataset whose start comes after the run's last step, or after every other dataset
        has ended, would never be trained: a configuration error, found from the bucket sizes
        every rank has (so on every rank)."""
        late = [d for d, epoch in self.first_epoch_by(total_steps).items() if epoch is None]
        if not late:
            return
        empty = [entry for entry in self._walk(total_steps) if entry.steps == 0]
        if empty:
            names = ", ".join(f"'{d}'" for d in late)
            raise ConfigError([
                f"no dataset is drawn in epoch {empty[0].epoch + 1} (from optimizer step "
                f"{empty[0].steps_before + 1}): the others have ended (end_epoch, end_step) "
                f"before {names} may start (start_epoch, start_step), so the run would wait "
                "forever; start it earlier or end the others later (python -m simpletuner "
                "plan shows where each dataset joins)"])
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


def paced_permutation(weights: np.ndarray, owners: np.ndarray, *parts: object) -> np.ndarray:
    """``uniform`` sampling's order of ``range(len(weights))``: each next item from owner
    ``o`` with odds proportional to its weight among the owners with items left, whatever
    their count; each owner's items in a shuffled order. Each owner is a Poisson clock of rate
    its weight (the sums of its items' exponential gaps, memoryless), the items merged by time;
    fixed by ``parts``."""
    n = len(weights)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    raw = np.random.PCG64(stable_seed("paced", *parts)).random_raw(n)
    gaps = -np.log(((raw >> np.uint64(11)).astype(np.float64) + 0.5) * _UNIT) / weights
    shuffled = stable_permutation(n, "paced-order", *parts)
    order = shuffled[np.argsort(owners[shuffled], kind="stable")]  # by owner, shuffled within
    times = np.cumsum(gaps[order])
    starts = np.flatnonzero(np.r_[True, owners[order][1:] != owners[order][:-1]])
    before = np.repeat(np.r_[0.0, times][starts], np.diff(np.r_[starts, n]))
    keys = np.empty(n)
    keys[order] = times - before  # each owner's clock from 0
    return stable_argsort(keys)


def group_order(per_bucket: np.ndarray, weights: np.ndarray, joins: np.ndarray,
                leaves: np.ndarray, *, seed: int, epoch: int, owners: np.ndarray | None = None,
                sampling: str = SAMPLINGS[0]) -> np.ndarray:
    """The bucket of each group (optimizer step) of ``epoch``. ``per_bucket``: each bucket's
    groups; ``weights``: its dataset's probability; ``owners``: its dataset's number (for
    ``uniform`` sampling); ``joins``: the step from which its dataset
    is drawn; ``leaves``: the step from which it no longer is (``NEVER``: to the end). At each
    join or leave step the groups still to come, with those of the datasets that joined and
    without those of the datasets that left, are ordered again by a permutation fixed by
    ``(seed, epoch, step)``. The epoch ends where its groups run out before the next such step."""
    active = per_bucket > 0
    steps = sorted({int(j) for j in joins[active]} | {int(j) for j in leaves[active]} - {NEVER})
    order: list[np.ndarray] = []
    pool = np.zeros(len(per_bucket), dtype=np.int64)
    done = 0
    for k, step in enumerate(steps):
        if done < step:
            break  # nothing left to draw before this step: the epoch ends
        pool += np.where(joins == step, per_bucket, 0)
        pool[leaves == step] = 0
        canonical = np.repeat(np.arange(len(per_bucket)), pool)
        parts = ("schedule", seed, epoch) + ((step,) if k else ())
        if sampling == "uniform":
            drawn = canonical[paced_permutation(weights[canonical], owners[canonical], *parts)]
        else:
            drawn = canonical[weighted_permutation(weights[canonical], *parts)]
        upto = steps[k + 1] - done if k + 1 < len(steps) else len(drawn)
        order.append(drawn[:upto])
        pool -= np.bincount(drawn[:upto], minlength=len(per_bucket))
        done += len(order[-1])
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)


def probability_share(schedules: Mapping[str, DatasetSchedule]) -> dict[str, float]:
    """Each dataset's probability as a share of their sum (what ``plan`` shows)."""
    total = math.fsum(s.probability for s in schedules.values())
    return {d: s.probability / total for d, s in schedules.items()}
