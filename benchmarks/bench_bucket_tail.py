"""bucket_tail: what trim loses, and what carry costs a rank.

    python benchmarks/bench_bucket_tail.py [--samples 1000000] [--buckets 40] [--world-size 8] [--json]

Over the synthetic Zipf-sized index of bench_split.py (N ids in K buckets):

* lost: the share of occurrences an epoch leaves untrained, for several effective batches
  E = batch x W x accumulation. Trim leaves each bucket's occurrences mod E every epoch; carry
  only what the last of ``EPOCHS`` epochs carries past the end (pure arithmetic,
  epoch_counts.bucket_counts, no permutation drawn);
* cost: rank 0's slices of every bucket in epoch 1 (where carry has something to carry in),
  trim against carry, at N/10 and N, in one process, alternating, best of 5.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench_split import build_buckets
from benchlib import emit, format_table, machine, parse_with_smoke
from simpletuner.helpers.metadata.epoch_counts import EffectiveBatch, bucket_counts
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

EPOCHS = 10
CONFIGS = [(1, 8, 1), (4, 8, 1), (4, 8, 4), (8, 16, 4)]  # (batch, processes, accumulation)
REPEATS = 5


def lost_share(buckets: dict, batch: int, world: int, accumulation: int, tail: str) -> float:
    """Occurrences untrained over EPOCHS epochs, as a share of EPOCHS passes."""
    eff = EffectiveBatch.for_dataset(batch, world, accumulation)
    passes = untrained = 0
    for ids in buckets.values():
        if len(ids) < eff.total:
            continue  # refused at start-up (or extended by oversubscription): not a tail
        counts = [bucket_counts(len(ids), 0, eff, tail=tail, epoch=epoch)
                  for epoch in range(EPOCHS)]
        untrained += sum(c.trimmed for c in counts) + counts[-1].carried_out
        passes += EPOCHS * len(ids)
    return untrained / passes if passes else 0.0  # every bucket refused: no tail to lose


def slice_seconds(buckets: dict, world: int, tail: str) -> float:
    index = DatasetIndex("d", buckets, {})
    sampler = MultiAspectSampler([SamplerDataset(index, str, 4, bucket_tail=tail)], seed=1,
                                 processes=world, rank=0, accumulation=1)
    start = time.perf_counter()
    sampler.slices(1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, samples=20_000, buckets=4, world_size=2)
    lost_rows, cost_rows, result = [], [], {"machine": machine(), "lost": [], "cost": []}
    for samples in (args.samples // 10, args.samples):
        buckets = build_buckets(samples, args.buckets)
        for batch, world, accumulation in CONFIGS:
            shares = {tail: lost_share(buckets, batch, world, accumulation, tail)
                      for tail in ("trim", "carry")}
            e = batch * world * accumulation
            lost_rows.append([samples, e, f"{100 * shares['trim']:.3f}%",
                              f"{100 * shares['carry']:.4f}%"])
            result["lost"].append({"samples": samples, "effective_batch": e, **shares})
        times = {"trim": [], "carry": []}
        for _ in range(REPEATS):
            for tail in times:
                times[tail].append(slice_seconds(buckets, args.world_size, tail))
        best = {tail: min(values) for tail, values in times.items()}
        cost_rows.append([samples, f"{best['trim']:.4f}", f"{best['carry']:.4f}",
                          f"{best['carry'] / best['trim']:.2f}",
                          f"{statistics.median(times['carry']):.4f}"])
        result["cost"].append({"samples": samples, **best})
    text = "\n\n".join([
        f"untrained over {EPOCHS} epochs, {args.buckets} buckets (share of all occurrences):",
        format_table(["samples", "E", "trim", "carry"], lost_rows),
        f"rank 0's slices of epoch 1, {args.world_size} ranks, batch 4 (seconds, best of "
        f"{REPEATS}):",
        format_table(["samples", "trim", "carry", "carry / trim", "carry median"], cost_rows),
        f"machine: {result['machine']}"])
    emit(result, args.json, text)


if __name__ == "__main__":
    main()
