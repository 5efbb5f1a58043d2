"""Time and memory of one rank's split of one large bucket (the split is linear in its size).

    python benchmarks/split_benchmark.py [--samples 1000000] [--processes 8]

Prints seconds and the peak of Python allocations (tracemalloc, numpy arrays included) for a
bucket given in sorted order (no copy of the id list) and in shuffled order (one sorted copy).
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from simpletuner.helpers.metadata.split import EffectiveBatch, split_bucket


def measure(ids: list[str], processes: int) -> tuple[float, float]:
    eff = EffectiveBatch.for_dataset(4, processes, 2)
    tracemalloc.start()
    start = time.perf_counter()
    split_bucket(ids, dataset_id="bench", bucket="1024x1024", epoch=0, seed=1, repeats=0,
                 effective=eff, rank=0)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    ids = [f"folder{i % 100:02d}/image_{i:08d}.jpg" for i in range(args.samples)]
    ids.sort()
    id_list_mib = (8 * len(ids)) / 2**20  # the list's pointers alone
    for label, bucket in (("sorted", ids), ("shuffled", random.Random(0).sample(ids, len(ids)))):
        seconds, peak = measure(bucket, args.processes)
        print(f"{label:>8}: {args.samples} samples, {args.processes} processes: {seconds:.2f}s, "
              f"peak {peak:.1f} MiB (a list of {args.samples} ids holds {id_list_mib:.1f} MiB "
              "of pointers)")


if __name__ == "__main__":
    main()
