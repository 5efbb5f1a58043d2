"""The dataset schedule: what probability and start_step cost the sampler.

    python benchmarks/bench_dataset_schedule.py [--samples 1000000] [--buckets 40] [--json]

Over the synthetic Zipf-sized index of bench_split.py (N ids in K buckets) as two datasets of
N/2 each, one rank of 8, batch 4: the schedule of groups of epoch 1 (``_epoch_schedule``) with
both datasets at probability 1 (the plain shuffle), with one at 0.3 (weighted keys), and with
one also joining at the middle of epoch 1 (two phases); and the timeline's entry of epoch 1000
at resume, with and without a dataset that joins late. In one process, alternating, best of 5.
"""

from __future__ import annotations

import argparse
import time

from bench_split import build_buckets
from benchlib import emit, format_table, machine, parse_with_smoke
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.dataset_schedule import DatasetSchedule
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

REPEATS = 5
WORLD, BATCH = 8, 4


def sampler_for(buckets: dict, second: DatasetSchedule) -> MultiAspectSampler:
    keys = sorted(buckets)
    halves = ({k: buckets[k] for k in keys[::2]}, {k: buckets[k] for k in keys[1::2]})
    datasets = [SamplerDataset(DatasetIndex("a", halves[0], {}), str, BATCH),
                SamplerDataset(DatasetIndex("b", halves[1], {}), str, BATCH, schedule=second)]
    return MultiAspectSampler(datasets, seed=1, processes=WORLD, rank=0, accumulation=1)


def schedule_seconds(buckets: dict, second: DatasetSchedule) -> float:
    sampler = sampler_for(buckets, second)
    sampler.counts(1)
    start = time.perf_counter()
    sampler._epoch_schedule(1)
    return time.perf_counter() - start


def resume_seconds(buckets: dict, second: DatasetSchedule) -> float:
    sampler = sampler_for(buckets, second)
    start = time.perf_counter()
    sampler.timeline.entry(1000)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, samples=2000, buckets=4)
    buckets = build_buckets(args.samples, args.buckets)
    steps = sampler_for(buckets, DatasetSchedule()).micro_batches_in(0)
    alone = sampler_for(buckets, DatasetSchedule(start_epoch=10 ** 6)).micro_batches_in(0)
    cases = {"probability 1": DatasetSchedule(), "probability 0.3": DatasetSchedule(0.3),
             "0.3, joins mid-epoch 1": DatasetSchedule(0.3, start_step=alone + alone // 2),
             "start_epoch 3": DatasetSchedule(start_epoch=3)}
    best = {}
    for name, second in cases.items():
        best[name] = (min(schedule_seconds(buckets, second) for _ in range(REPEATS)),
                      min(resume_seconds(buckets, second) for _ in range(REPEATS)))
    rows = [[name, f"{s:.4f}", f"{r:.4f}"] for name, (s, r) in best.items()]
    result = {"machine": machine(), "samples": args.samples, "groups_per_epoch": steps,
              "seconds": {name: {"epoch_schedule": s, "timeline_epoch_1000": r}
                          for name, (s, r) in best.items()}}
    text = "\n\n".join([
        f"{args.samples} samples, {args.buckets} buckets as two datasets, {WORLD} ranks, batch "
        f"{BATCH}: {steps} groups per epoch (seconds, best of {REPEATS}):",
        format_table(["dataset b", "epoch schedule", "timeline at epoch 1000"], rows),
        f"machine: {result['machine']}"])
    emit(result, args.json, text)


if __name__ == "__main__":
    main()
