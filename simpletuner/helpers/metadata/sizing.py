"""`plan --num-processes N`: what the split would keep, trim or carry on N ranks, before renting
them.

Pure arithmetic over the bucket index (epoch_counts.bucket_counts), no permutation is drawn. A
trimmed bucket is the same every epoch; a carried one (``bucket_tail: carry``) is shown for the
first ``SIZED_EPOCHS`` epochs, since what it carries in and out changes from epoch to epoch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from simpletuner.helpers.metadata.epoch_counts import BucketCounts, bucket_counts
from simpletuner.helpers.metadata.split import (DatasetSpec, UndersizedBucketsError,
                                                check_bucket_sizes)

SIZED_EPOCHS = 3


def _epoch_entry(c: BucketCounts) -> dict:
    return {"carried_in": c.carried_in, "kept": c.kept, "trimmed": c.trimmed,
            "carried_out": c.carried_out, "micro_batches": c.micro_batches,
            "optimizer_steps": c.optimizer_steps}


# (dataset id, epoch) -> the epoch it first joined the schedule, None before (start_epoch,
# start_step: the sampler's timeline); by default every dataset from epoch 0.
FirstEpoch = Callable[[str, int], "int | None"]


def split_sizing(specs: Sequence[DatasetSpec], processes: int, accumulation: int,
                 first_epoch: FirstEpoch = lambda dataset_id, epoch: 0,
                 context_parallel: int = 1) -> dict:
    """Per dataset and bucket, for each of the first SIZED_EPOCHS epochs: carried in, kept,
    trimmed, carried out, micro-batches per rank, optimizer steps (nothing in an epoch before
    the dataset joins); and the totals per epoch. ``processes``: the data-parallel groups the
    split is over, of ``context_parallel`` ranks each (helpers/metadata/mesh.py)."""
    datasets = {}
    micro_batches = [0] * SIZED_EPOCHS
    for spec in sorted(specs, key=lambda s: s.dataset_id):
        eff = spec.effective_batch(processes, accumulation)
        buckets = {}
        firsts = [first_epoch(spec.dataset_id, epoch) for epoch in range(SIZED_EPOCHS)]
        for key, ids in sorted(spec.buckets.items()):
            epochs = [bucket_counts(len(ids), spec.repeats, eff, tail=spec.bucket_tail,
                                    epoch=epoch, first_epoch=first or 0,
                                    allow_oversubscription=spec.allow_oversubscription)
                      for epoch, first in enumerate(firsts)]
            epochs = [c if first is not None else replace(c, carried_in=0, kept=0, trimmed=0,
                                                          carried_out=0)
                      for c, first in zip(epochs, firsts)]
            buckets[key] = {"samples": epochs[0].samples, "occurrences": epochs[0].occurrences,
                            "extended": epochs[0].extended,
                            "too_small": (not epochs[0].extended
                                          and epochs[0].occurrences < eff.total),
                            "epochs": [_epoch_entry(c) for c in epochs]}
            if not spec.evaluation:
                micro_batches = [m + c.micro_batches for m, c in zip(micro_batches, epochs)]
        datasets[spec.dataset_id] = {"evaluation": spec.evaluation, "repeats": spec.repeats,
                                     "bucket_tail": spec.bucket_tail,
                                     "batch_size": eff.batch_size, "effective_batch": eff.total,
                                     "in_epochs": [first is not None for first in firsts],
                                     "buckets": buckets}
    try:
        check_bucket_sizes(specs, processes, accumulation)
        problem = None
    except UndersizedBucketsError as exc:
        problem = str(exc)
    return {"num_processes": processes * context_parallel, "data_parallel_groups": processes,
            "context_parallel": context_parallel, "accumulation": accumulation,
            "micro_batches_per_epoch": micro_batches,
            "optimizer_steps_per_epoch": [m // accumulation for m in micro_batches],
            "datasets": datasets, "problem": problem}


def _flag(bucket: dict) -> str:
    if bucket["extended"]:
        return "  extended (oversubscription)"
    return "  TOO SMALL" if bucket["too_small"] else ""


def _bucket_rows(dataset: dict) -> list[str]:
    """One row per bucket; a carried bucket (training) one row per epoch shown."""
    carried = dataset["bucket_tail"] == "carry" and not dataset["evaluation"]
    if not carried:
        rows = [f"    {'bucket':>10} {'samples':>8} {'kept':>8} {'trimmed':>8} "
                f"{'micro/rank':>10} {'steps':>6}"]
        for key, b in dataset["buckets"].items():
            e = b["epochs"][0]
            rows.append(f"    {key:>10} {b['samples']:>8} {e['kept']:>8} {e['trimmed']:>8} "
                        f"{e['micro_batches']:>10} {e['optimizer_steps']:>6}{_flag(b)}")
        return rows
    rows = [f"    {'bucket':>10} {'samples':>8} {'epoch':>5} {'carried in':>10} {'kept':>8} "
            f"{'carried out':>11} {'micro/rank':>10} {'steps':>6}"]
    for key, b in dataset["buckets"].items():
        for epoch, e in enumerate(b["epochs"]):
            first = (key, b["samples"]) if epoch == 0 else ("", "")
            rows.append(f"    {first[0]:>10} {first[1]:>8} {epoch:>5} {e['carried_in']:>10} "
                        f"{e['kept']:>8} {e['carried_out']:>11} {e['micro_batches']:>10} "
                        f"{e['optimizer_steps']:>6}{_flag(b) if epoch == 0 else ''}")
    return rows


def sizing_table(sizing: dict) -> str:
    """The human-readable form of ``split_sizing``."""
    over = f"{sizing['num_processes']} processes"
    if sizing["context_parallel"] > 1:
        over = (f"{sizing['data_parallel_groups']} data-parallel groups ({over}, "
                f"context_parallel_size {sizing['context_parallel']})")
    lines = [f"split over {over}, gradient accumulation {sizing['accumulation']}:"]
    for dataset_id, d in sizing["datasets"].items():
        kind = " (evaluation: every sample once)" if d["evaluation"] else (
            f", bucket_tail {d['bucket_tail']}")
        absent = [str(epoch) for epoch, held in enumerate(d["in_epochs"]) if not held]
        if absent:  # start_epoch, start_step
            kind += f", not in epochs {', '.join(absent)} (it joins later)"
        lines.append(f"  dataset '{dataset_id}': E = {d['effective_batch']}, "
                     f"repeats {d['repeats']}{kind}")
        lines += _bucket_rows(d)
    micro, steps = sizing["micro_batches_per_epoch"], sizing["optimizer_steps_per_epoch"]
    if len(set(micro)) == 1:
        lines.append(f"  per epoch: {micro[0]} micro-batches per rank, {steps[0]} optimizer "
                     "steps")
    else:
        shown = ", ".join(map(str, range(len(micro))))
        lines.append(f"  epochs {shown}: {', '.join(map(str, micro))} micro-batches per rank, "
                     f"{', '.join(map(str, steps))} optimizer steps (bucket_tail carry)")
    return "\n".join(lines)
