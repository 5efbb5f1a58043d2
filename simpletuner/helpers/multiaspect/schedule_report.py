"""How `plan` shows the dataset schedule: each training dataset's probability (and its share of
the odds), start_epoch and start_step, where it joins on the planned processes, and whether it
is regularisation data. Pure arithmetic over the bucket index, as the sampler's timeline."""

from __future__ import annotations

import math
from typing import Sequence

from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.metadata.epoch_counts import bucket_counts
from simpletuner.helpers.metadata.split import DatasetSpec
from simpletuner.helpers.multiaspect.dataset_schedule import (SAMPLINGS, DatasetSchedule,
                                                              DatasetTimeline, probability_share)


def _groups_of(specs: dict[str, DatasetSpec], processes: int, accumulation: int):
    def groups(dataset_id: str, epoch: int, first_epoch: int) -> list[int]:
        spec = specs[dataset_id]
        eff = spec.effective_batch(processes, accumulation)
        return [bucket_counts(len(spec.buckets[key]), spec.repeats, eff, tail=spec.bucket_tail,
                              epoch=epoch, first_epoch=first_epoch,
                              allow_oversubscription=spec.allow_oversubscription
                              ).optimizer_steps for key in sorted(spec.buckets)]
    return groups


def _timeline(datasets: Sequence, specs: Sequence[DatasetSpec], processes: int,
              accumulation: int, seed: int | None, sampling: str = SAMPLINGS[0]
              ) -> DatasetTimeline:
    """The sampler's timeline of the training datasets, from their specs. Without a configured
    seed (broadcast at run time) it assumes 0: only a join after another dataset's end_step
    depends on it."""
    schedules = {ds.id: DatasetSchedule.of(ds) for ds in datasets if kind_of(ds).trains}
    by_id = {spec.dataset_id: spec for spec in specs if spec.dataset_id in schedules}
    return DatasetTimeline(schedules, _groups_of(by_id, processes, accumulation), seed=seed or 0,
                           sampling=sampling)


def schedule_first_epochs(datasets: Sequence, specs: Sequence[DatasetSpec], processes: int,
                          accumulation: int, seed: int | None, sampling: str = SAMPLINGS[0]):
    """(dataset id, epoch) -> the epoch it first joined, None before and after: for `plan
    --num-processes` (evaluation datasets: 0)."""
    timeline = _timeline(datasets, specs, processes, accumulation, seed, sampling)

    def first_epoch(dataset_id: str, epoch: int) -> int | None:
        if dataset_id not in timeline.schedules:
            return 0
        entry = timeline.entry(epoch)  # None too once it has ended (end_epoch, end_step)
        return entry.first_epochs.get(dataset_id) if dataset_id in entry.joins else None
    return first_epoch


def _steps_of_epochs(timeline: DatasetTimeline, epochs: int) -> int | float:
    """Optimizer steps of the first ``epochs`` epochs. Past the epoch where the timeline
    settles its step counts are not worked out, and not needed: every dataset has joined by
    then, so the run's steps are unbounded for the joins."""
    last = timeline.entry(epochs - 1)
    return math.inf if last.steps is None else last.steps_before + last.steps


def dataset_schedule(datasets: Sequence, specs: Sequence[DatasetSpec], processes: int,
                     accumulation: int, max_train_steps: int | None,
                     num_train_epochs: int | None, seed: int | None,
                     sampling: str = SAMPLINGS[0]) -> dict:
    """dataset id -> its schedule keys, odds share, data_backend_sampling, regularisation
    flag, and where it joins: epoch (from 1, as start_epoch counts), that epoch's step and the
    optimizer step (from 1); joins None when it would not start within the run's steps."""
    training = [ds for ds in datasets if kind_of(ds).trains]
    timeline = _timeline(datasets, specs, processes, accumulation, seed, sampling)
    limit = max_train_steps
    if limit is None:  # num_train_epochs (launch_checks asks for one of the two)
        limit = _steps_of_epochs(timeline, max(num_train_epochs or 1, 1))
    first = timeline.first_epoch_by(limit)
    share = probability_share(timeline.schedules)
    found = {}
    for ds in training:
        epoch = first[ds.id]
        joins = None
        if epoch is not None:
            entry = timeline.entry(epoch)
            step = entry.joins[ds.id]
            joins = {"epoch": epoch + 1, "step_of_epoch": step + 1,
                     "optimizer_step": entry.steps_before + step + 1}
        found[ds.id] = {"probability": ds.probability, "share": share[ds.id],
                        "sampling": sampling,
                        "start_epoch": ds.start_epoch, "start_step": ds.start_step,
                        "end_epoch": ds.end_epoch or None, "end_step": ds.end_step or None,
                        "is_regularisation_data": ds.is_regularisation_data, "joins": joins}
    return found


def schedule_table(schedule: dict, processes: int, accumulation: int) -> str:
    sampling = next(iter(schedule.values()))["sampling"] if schedule else SAMPLINGS[0]
    odds = {"auto-weighting": "of the odds per step, times its groups left",
            "uniform": "of the odds per step while it has groups left"}[sampling]
    lines = [f"schedule over {processes} processes, gradient accumulation {accumulation}, "
             f"data_backend_sampling {sampling}:"]
    for dataset_id, d in schedule.items():
        where = "never within the training steps"
        if d["joins"] is not None:
            j = d["joins"]
            where = (f"joins epoch {j['epoch']} (trace epoch {j['epoch'] - 1}) at its step "
                     f"{j['step_of_epoch']} (optimizer step {j['optimizer_step']})")
        ends = "".join(f", {key} {d[key]}" for key in ("end_epoch", "end_step")
                       if d[key] is not None)
        kind = "; regularisation (target: the base model's prediction)" if (
            d["is_regularisation_data"]) else ""
        lines.append(f"  dataset '{dataset_id}': probability {d['probability']:g} "
                     f"({100 * d['share']:.1f}% {odds}), start_epoch {d['start_epoch']}, "
                     f"start_step {d['start_step']}{ends}: {where}{kind}")
    return "\n".join(lines)
