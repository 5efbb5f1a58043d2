"""The audit's own account of the dataset schedule (start_epoch, start_step, probability).

Re-derived from plan.json's settings alone, epoch by epoch from epoch 0, in the audit's
arithmetic (verify.expected_leftovers), not the sampler's: which datasets an epoch holds, the
step of the epoch from which each may be drawn and the epoch each first joined. Exactly once
then means: in an epoch a dataset is part of, every occurrence of its pass (with what it carried
in, less what it trims or carries out) is trained once; in an epoch before it joins, none is;
and no micro-batch of it comes before its start step. ``probability`` changes only the order of
steps, so it is not re-derived; the counts above prove it dropped or repeated nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Presence:
    """A dataset in one epoch: from which step of the epoch, and the epoch it first joined."""

    join: int
    first_epoch: int


def _join_offset(d: dict, epoch: int, steps_before: int) -> int | None:
    if epoch + 1 < max(d.get("start_epoch", 1), 1):
        return None
    return max(0, d.get("start_step", 0) - 1 - steps_before)


def expected_presence(plan: dict, epochs: int,
                      steps_of: Callable[[str, int], int]) -> list[dict[str, Presence]]:
    """Per epoch: dataset id -> Presence, for the datasets the epoch holds. ``steps_of(d,
    nth)``: dataset d's optimizer steps in the nth epoch since it joined."""
    found: list[dict[str, Presence]] = []
    first: dict[str, int] = {}
    steps_before = 0
    for epoch in range(epochs):
        offsets = {dataset_id: _join_offset(d, epoch, steps_before)
                   for dataset_id, d in plan["datasets"].items()}
        present: dict[str, Presence] = {}
        steps = 0
        for offset, dataset_id in sorted((o, i) for i, o in offsets.items() if o is not None):
            if dataset_id not in first and offset > steps:
                break  # the epoch's steps run out before it may start
            first.setdefault(dataset_id, epoch)
            present[dataset_id] = Presence(0 if first[dataset_id] < epoch else offset,
                                           first[dataset_id])
            steps += steps_of(dataset_id, epoch - first[dataset_id])
        found.append(present)
        steps_before += steps
    return found


def schedule_problems(plan: dict, epoch: int, per_rank: dict[int, list[dict]],
                      present: dict[str, Presence]) -> list[str]:
    """No micro-batch of a dataset before it joins (its start epoch and start step)."""
    problems = []
    accumulation = plan["accumulation"]
    for rank, records in per_rank.items():
        for record in records:
            where = present.get(record["dataset"])
            if where is None:
                problems.append(f"epoch {epoch}: rank {rank}: micro-batch {record['step']} is "
                                f"from dataset '{record['dataset']}', which has not joined the "
                                "schedule yet (start_epoch, start_step)")
                break
            if record["step"] < where.join * accumulation:
                problems.append(f"epoch {epoch}: rank {rank}: micro-batch {record['step']} is "
                                f"from dataset '{record['dataset']}' before its start step "
                                f"(step {where.join} of the epoch)")
                break
    return problems
