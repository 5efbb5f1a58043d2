"""The audit's own account of the dataset schedule (start and end, probability).

Re-derived from plan.json's settings alone, epoch by epoch from epoch 0, in the audit's
arithmetic (verify.expected_leftovers), not the sampler's: which datasets an epoch holds, the
step of the epoch from which each may be drawn and the epoch each first joined. Exactly once
then means: in an epoch a dataset is part of, every occurrence of its pass (with what it carried
in, less what it trims or carries out) is trained once; in an epoch before it joins, none is;
and no micro-batch of it comes before its start step. ``probability`` changes only the order of
steps, so it is not re-derived; the counts above prove it dropped or repeated nothing.

A dataset that ends within an epoch (end_step) is cut where the group order puts it, which the
audit does not re-derive: that epoch's length is the traced one (lockstep makes it the same on
every rank), the dataset trains no occurrence twice and none from its end step on, and what it
leaves untrained is reported as ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Presence:
    """A dataset in one epoch: from which step of the epoch, and the epoch it first joined."""

    join: int
    first_epoch: int
    leave: int | None = None  # the step of the epoch from which it is no longer drawn


def _window(d: dict, epoch: int, steps_before: int) -> tuple[int, int | None] | None:
    """(join, leave) steps of ``epoch`` for dataset ``d``; None when it is not drawn in it."""
    end_epoch, end_step = d.get("end_epoch"), d.get("end_step")
    join = max(0, d.get("start_step", 0) - 1 - steps_before)
    leave = None if end_step is None else max(0, end_step - steps_before)
    if end_epoch is not None and epoch >= end_epoch:
        leave = 0
    if epoch + 1 < max(d.get("start_epoch", 1), 1) or (leave is not None and leave <= join):
        return None
    return join, leave


def expected_presence(plan: dict, epochs: int, steps_of: Callable[[str, int], int],
                      traced_steps: Callable[[int], int]) -> list[dict[str, Presence]]:
    """Per epoch: dataset id -> Presence, for the datasets the epoch holds. ``steps_of(d,
    nth)``: dataset d's optimizer steps in the nth epoch since it joined; ``traced_steps``:
    an epoch's optimizer steps in the traces (used only where an end cuts the epoch)."""
    found: list[dict[str, Presence]] = []
    first: dict[str, int] = {}
    steps_before = 0
    for epoch in range(epochs):
        windows = {dataset_id: window for dataset_id, d in plan["datasets"].items()
                   if (window := _window(d, epoch, steps_before)) is not None}
        joins = {i: 0 if i in first else join for i, (join, _) in windows.items()}
        steps = 0
        for dataset_id, offset in sorted(joins.items(), key=lambda item: (item[1], item[0])):
            if offset > steps:
                break  # the epoch's steps run out before it may start
            steps += steps_of(dataset_id, epoch - first.get(dataset_id, epoch))
        if any(leave is not None and leave < steps for _, leave in windows.values()):
            steps = traced_steps(epoch)  # an end cuts this epoch
        present = {}
        for dataset_id, offset in joins.items():
            if offset <= steps:
                first.setdefault(dataset_id, epoch)
                leave = windows[dataset_id][1]
                present[dataset_id] = Presence(offset, first[dataset_id],
                                               leave if leave is not None and leave <= steps
                                               else None)
        found.append(present)
        steps_before += steps
    return found


def schedule_problems(plan: dict, epoch: int, per_rank: dict[int, list[dict]],
                      present: dict[str, Presence]) -> list[str]:
    """No micro-batch of a dataset before it joins (its start epoch and start step) or after
    it ends (end_step)."""
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
            if where.leave is not None and record["step"] >= where.leave * accumulation:
                problems.append(f"epoch {epoch}: rank {rank}: micro-batch {record['step']} is "
                                f"from dataset '{record['dataset']}' after its end (end_step: "
                                f"step {where.leave} of the epoch)")
                break
    return problems
