"""Split: one rank's cost of its slices and of starting the sampler, against whole-list shuffling.

    python benchmarks/bench_split.py [--samples 1000000] [--buckets 40] [--world-size 8] [--json]

A synthetic bucket index of N sample ids (paths such as 'part00012/img_00012345.jpg') in K buckets
of uneven size (Zipf-like), each bucket sorted as the index holds it. Two sides, measured at N/10
and N, each in a fresh subprocess so that memory is its own:

* project: DatasetIndex and MultiAspectSampler for rank 0 of W; every slice of epoch 0
  (sampler.slices) and the first micro-batch (what a rank does before its first step). Its
  buckets are in canonical order by construction (see build_buckets), so nothing is sorted;
* reference, the way of the trainer this project is modelled on: per bucket, sort the id list
  (canonical order), copy and shuffle it with random.Random, trim to a multiple of E, and slice
  out this rank's part.

Memory: "holding the path list" is the RSS growth from building the index (the id strings and
the lists of pointers). The peak is read from the kernel (VmHWM, reset after the index is built),
so "extra" is what the split itself adds on top of holding the list once.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time

import numpy as np

from benchlib import (current_rss_mb, emit, format_table, machine, parse_with_smoke, peak_rss_mb,
                      ratio, reset_peak_rss, verdict)
from simpletuner.helpers.metadata.split import SortedIds

SEED, EPOCH, RANK = 1234, 0, 0


def build_buckets(samples: int, buckets: int) -> dict[str, SortedIds]:
    """Deterministic, as DatasetIndex.buckets holds them on every rank.

    The id strings are made in sample id order and appended to their bucket's SortedIds, as
    ``refresh_index`` does from the sorted listing on the main rank and ``load_index`` does from
    the rows of the cached file table on the others: neighbours in a bucket lie apart in
    memory, and the buckets are known to be in canonical order without a check."""
    weights = np.array([1 / (k + 1) for k in range(buckets)])
    keys = [f"{512 + 64 * (k % 16)}x{512 + 64 * (k // 16)}" for k in range(buckets)]
    assignment = np.random.default_rng(0).choice(buckets, size=samples, p=weights / weights.sum())
    ids: dict[str, list[str]] = {key: [] for key in keys}
    for i, k in enumerate(assignment.tolist()):
        ids[keys[k]].append(_sample_id(i))
    # SortedIds is read-only: each is made from its finished list. An index holds no empty
    # bucket, which a small --samples would leave.
    return {key: SortedIds(bucket) for key, bucket in ids.items() if bucket}


def _sample_id(i: int) -> str:
    return f"part{i // 1000:05d}/img_{i:08d}.jpg"  # sorted order = numeric order


def reference_split(buckets: dict[str, list[str]], world: int, batch: int,
                    accumulation: int, rank: int) -> dict[str, list[str]]:
    """Whole Python lists per bucket: sorted copy, random.Random shuffle, trim, slice."""
    effective = batch * world * accumulation
    mine = {}
    for key in sorted(buckets):
        ids = sorted(buckets[key])
        random.Random(f"{SEED}/{key}/{EPOCH}").shuffle(ids)
        kept = len(ids) - len(ids) % effective
        part: list[str] = []
        for start in range(rank * batch, kept, batch * world):
            part.extend(ids[start:start + batch])
        mine[key] = part
    return mine


def project_split(buckets: dict[str, list[str]], world: int, batch: int, accumulation: int,
                  rank: int) -> int:
    from simpletuner.helpers.metadata.index import DatasetIndex
    from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

    index = DatasetIndex("bench", buckets, {})
    dataset = SamplerDataset(index, caption_for=lambda sample_id: "", batch_size=batch)
    sampler = MultiAspectSampler([dataset], seed=SEED, processes=world, rank=rank,
                                 accumulation=accumulation)
    slices = sampler.slices(EPOCH)
    next(iter(sampler))
    return sum(s.micro_batches * s.batch_size for s in slices)  # ids are looked up per batch


def run_one(side: str, samples: int, buckets_count: int, world: int, batch: int,
            accumulation: int) -> dict:
    """In a fresh process: build the index, then time and measure one rank's split."""
    if side == "project":  # imports are not the split's cost
        import simpletuner.helpers.multiaspect.sampler  # noqa: F401
    gc.collect()
    baseline = current_rss_mb()
    buckets = build_buckets(samples, buckets_count)
    gc.collect()
    holding = current_rss_mb()
    exact_peak = reset_peak_rss()
    start = time.perf_counter()
    cpu_start = time.process_time()
    if side == "project":
        project_split(buckets, world, batch, accumulation, RANK)
    else:
        reference_split(buckets, world, batch, accumulation, RANK)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    peak = peak_rss_mb()
    return {"seconds": seconds, "cpu_seconds": cpu, "path_list_mb": holding - baseline,
            "peak_extra_mb": max(0.0, peak - holding), "peak_rss_mb": peak,
            "exact_peak": exact_peak}


def measure(side: str, samples: int, args) -> dict:
    runs = []
    for _ in range(args.repeats):
        if args.smoke:  # no fresh process: the run only shows that the code works
            runs.append(run_one(side, samples, args.buckets, args.world_size, args.batch_size,
                                args.accumulation))
            continue
        command = [sys.executable, __file__, "--one", side, "--samples", str(samples),
                   "--buckets", str(args.buckets), "--world-size", str(args.world_size),
                   "--batch-size", str(args.batch_size), "--accumulation", str(args.accumulation)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{side} at {samples} samples failed:\n{done.stderr}")
        runs.append(json.loads(done.stdout))
    # Best of the fresh processes: other programs on the machine only ever add time.
    best = {key: min(r[key] for r in runs) for key in ("seconds", "cpu_seconds")}
    best["path_list_mb"] = statistics.median(r["path_list_mb"] for r in runs)
    best["peak_extra_mb"] = max(r["peak_extra_mb"] for r in runs)
    best["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    best["exact_peak"] = all(r["exact_peak"] for r in runs)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in best.items()}


def render(result: dict) -> str:
    rows = []
    for n, sides in result["by_samples"].items():
        project, reference = sides["project"], sides["reference"]
        for name, m in (("reference (sort+shuffle lists)", reference), ("project", project)):
            rows.append([f"{name}, {int(n):,}", m["seconds"], m["cpu_seconds"],
                         m["path_list_mb"], m["peak_extra_mb"],
                         ratio(m["seconds"], reference["seconds"])])
    m = result["machine"]
    lines = [
        f"Split: {result['buckets']} buckets, {result['world_size']} ranks, micro-batch "
        f"{result['batch_size']}, accumulation {result['accumulation']}; one rank's slices of "
        f"epoch 0 + first micro-batch; "
        f"{m['cpus']} CPUs, load {m['load_average_1_5_15']}",
        format_table(["", "seconds", "cpu s", "path list MiB", "extra peak MiB",
                      "x reference"], rows),
        f"per rank at {result['samples']:,}: {result['per_rank_seconds']} s vs reference "
        f"{result['reference_seconds']} s; peak RSS {result['peak_rss_mb']} MiB "
        f"(holding the path list twice: {result['path_list_twice_mb']} MiB above the "
        "interpreter)",
        f"growth {result['samples'] // 10:,} -> {result['samples']:,} (x10 samples): project "
        f"x{result['growth']['project_seconds']} time, x{result['growth']['project_extra_mb']} "
        f"extra memory; reference x{result['growth']['reference_seconds']} time",
    ]
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5,
                        help="fresh processes per side and size; best time, largest peak")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", choices=["project", "reference"], help=argparse.SUPPRESS)
    args = parse_with_smoke(parser, samples=2000, buckets=4, repeats=1)
    if args.one:  # the child process of measure()
        print(json.dumps(run_one(args.one, args.samples, args.buckets, args.world_size,
                                 args.batch_size, args.accumulation)))
        return

    result = {"machine": machine(), "samples": args.samples, "buckets": args.buckets,
              "world_size": args.world_size, "batch_size": args.batch_size,
              "accumulation": args.accumulation, "by_samples": {}}
    for n in (args.samples // 10, args.samples):
        print(f"measuring {n:,} samples...", file=sys.stderr)
        result["by_samples"][str(n)] = {side: measure(side, n, args)
                                        for side in ("reference", "project")}
    small = result["by_samples"][str(args.samples // 10)]
    large = result["by_samples"][str(args.samples)]
    project, reference = large["project"], large["reference"]
    result.update({
        "per_rank_seconds": project["seconds"], "reference_seconds": reference["seconds"],
        "per_rank_over_reference": ratio(project["seconds"], reference["seconds"]),
        "peak_rss_mb": project["peak_rss_mb"],
        "reference_peak_rss_mb": reference["peak_rss_mb"],
        "path_list_mb": project["path_list_mb"],
        "path_list_twice_mb": round(2 * project["path_list_mb"], 1),
        "growth": {
            "project_seconds": ratio(project["seconds"], small["project"]["seconds"]),
            "project_extra_mb": ratio(project["peak_extra_mb"],
                                      small["project"]["peak_extra_mb"]),
            "reference_seconds": ratio(reference["seconds"], small["reference"]["seconds"]),
        },
    })
    result["targets"] = {
        # None: the reference took no measurable time (--smoke's sizes)
        "per-rank time at most 1/3 of the reference": (result["per_rank_over_reference"] or 0)
        <= 1 / 3,
        "peak memory at most holding the path list twice":
            project["peak_extra_mb"] <= project["path_list_mb"],
        "linear growth (x10 samples -> at most x15 time)":
            (result["growth"]["project_seconds"] or 0) <= 15,
    }
    result["machine_after"] = machine()["load_average_1_5_15"]
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
