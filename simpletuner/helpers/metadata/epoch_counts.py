"""How many occurrences of one bucket an epoch trains, trims or carries: pure arithmetic.

A *pass* is one permutation of a bucket's ``N`` occurrences (each sample ``repeats+1`` times);
epoch ``e`` trains from pass ``e``. Training takes whole effective batches ``E``, so an epoch
cannot end with the ``leftover`` occurrences short of one. ``bucket_tail`` says what happens to
them:

- ``trim``: they are not trained (reported). ``leftover = N mod E`` every epoch.
- ``carry``: they open the next epoch, ahead of its own pass, so every occurrence of every pass
  is trained exactly once; only the last epoch's leftover is never trained. Epoch ``e``'s order
  is ``carried_in(e)`` occurrences of pass ``e-1`` followed by pass ``e``; its leftover is
  ``(carried_in(e) + N) mod E``, fewer than ``E <= N``, so it is always a tail of pass ``e``
  itself and ``carried_in(e) = (e * N) mod E`` in closed form: no earlier epoch is replayed.

Evaluation datasets are never trimmed: every occurrence is evaluated once, one per rank per
micro-batch, and ranks past the end of a bucket run a stand-in that is not counted (split.py),
so every rank still makes the same calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simpletuner.configuration.options import BucketTail


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

    @property
    def per_micro_batch(self) -> int:
        """Occurrences of one micro-batch step, over all ranks."""
        return self.batch_size * self.processes

    def describe(self) -> str:
        if self.evaluation:
            return (f"{self.total} ({self.processes} processes; evaluation dataset: one sample "
                    "per process, gradient accumulation ignored)")
        return (f"{self.total} (train_batch_size {self.batch_size} x {self.processes} processes "
                f"x {self.accumulation} gradient_accumulation_steps)")


@dataclass(frozen=True)
class BucketCounts:
    """One bucket in one epoch. ``kept`` occurrences are trained: ``carried_in`` of them from
    the previous pass first, then ``kept - carried_in`` of this epoch's pass."""

    samples: int
    occurrences: int   # one pass: samples x (repeats+1), or E when extended
    carried_in: int    # bucket_tail carry: the previous pass's leftover, trained first
    kept: int          # a multiple of E; evaluation: every occurrence
    trimmed: int       # bucket_tail trim: this pass's leftover, not trained
    carried_out: int   # bucket_tail carry: this pass's leftover, opens the next epoch
    extended: bool     # cyclically extended to E by allow_dataset_oversubscription
    effective: EffectiveBatch

    @property
    def micro_batches(self) -> int:
        """Per rank; a multiple of the accumulation steps. Evaluation: ranks past the last
        occurrence fill the bucket's last step with a stand-in (not counted)."""
        return math.ceil(self.kept / self.effective.per_micro_batch)

    @property
    def optimizer_steps(self) -> int:
        return self.micro_batches // self.effective.accumulation

    @property
    def leftover(self) -> int:
        return self.trimmed + self.carried_out


def carried_in(occurrences: int, effective_total: int, epoch: int) -> int:
    """Occurrences of pass ``epoch-1`` that open epoch ``epoch`` under bucket_tail carry (see
    the module docstring; valid because a bucket holds at least E occurrences)."""
    return (epoch * occurrences) % effective_total


def bucket_counts(samples: int, repeats: int, effective: EffectiveBatch, *,
                  tail: BucketTail, epoch: int = 0, first_epoch: int = 0,
                  allow_oversubscription: bool = False) -> BucketCounts:
    """The arithmetic of one bucket in ``epoch``, shared by the split, the check and ``plan``.
    ``first_epoch``: the epoch its dataset joined the schedule (start_epoch, start_step), where
    nothing is carried in."""
    e = effective.total
    occurrences = samples * (repeats + 1)
    if effective.evaluation:
        return BucketCounts(samples, occurrences, 0, occurrences, 0, 0, False, effective)
    if allow_oversubscription and repeats == 0 and 0 < occurrences < e:
        return BucketCounts(samples, e, 0, e, 0, 0, True, effective)
    carried = carried_in(occurrences, e, epoch - first_epoch) if tail == "carry" and occurrences >= e else 0
    leftover = (carried + occurrences) % e
    trimmed, carried_out = (leftover, 0) if tail == "trim" or occurrences < e else (0, leftover)
    return BucketCounts(samples, occurrences, carried, carried + occurrences - leftover,
                        trimmed, carried_out, False, effective)
