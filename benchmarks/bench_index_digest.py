"""The index digest at start-up: hashed by every rank, against recorded in the index cache.

    python benchmarks/bench_index_digest.py [--samples 1000000,10000000] [--buckets 40] [--json]

A synthetic bucket index of N ids (bench_sampler_state.py's) on one process; both sides in the
same process, one after the other:

* computed (before): the index as load_index made it while caches held no digest: the ranks'
  agreement check hashes every id (the JSON of the buckets, SHA-256) and the sampler's
  fingerprint hashed them again (two indexes over the same buckets here, so each pays);
* recorded (now): the index as load_index makes it from a cache holding ``index.digest``
  (computed once by the main rank as it writes the cache): the agreement check (one gather on
  a one-process accelerator: its digests and the comparison) and the fingerprint.

Also shown: what the main rank pays once, when it writes a new cache (one hash).
"""

from __future__ import annotations

import gc
import sys
import time

from bench_sampler_state import build_index, size_arguments
from benchlib import emit, format_table, machine, ratio, verdict
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

TARGET_SECONDS = 2.0  # the warm start per rank at 10 M, of which this is one part


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def start_up_digests(index: DatasetIndex, accelerator) -> float:
    """The agreement check, then the sampler's fingerprint, on one rank's index."""
    sampler = MultiAspectSampler([SamplerDataset(index, str, 4)], seed=1, processes=8, rank=0,
                                 accumulation=1)
    return (timed(lambda: MetadataBackend.check_index_agreement({"bench": index}, None,
                                                                accelerator))
            + timed(sampler.fingerprint))


def measure(samples: int, buckets: int, accelerator) -> dict:
    built = build_index(samples, buckets)

    def same(known: str | None = None) -> DatasetIndex:  # the same buckets, not copied
        index = DatasetIndex("bench", built.buckets, {})
        if known is not None:
            index.set_digest(known)
        return index

    write_once = timed(built.digest)  # the main rank, as it writes the cache
    recorded = built.digest()
    # before: the agreement's index and the sampler's were hashed apart (no digest recorded)
    computed = timed(same().digest) + timed(same().digest)
    now = start_up_digests(same(recorded), accelerator)
    del built
    gc.collect()
    return {"cache_write_digest_seconds": round(write_once, 3),
            "computed_seconds": round(computed, 3), "recorded_seconds": round(now, 5)}


def render(result: dict) -> str:
    rows = [[f"{int(n):,}", m["cache_write_digest_seconds"], m["computed_seconds"],
             m["recorded_seconds"], ratio(m["computed_seconds"], m["recorded_seconds"])]
            for n, m in result["by_samples"].items()]
    lines = [f"Index digest at start-up, one rank: {result['buckets']} buckets; "
             f"{result['machine']['cpus']} CPUs, load {result['machine']['load_average_1_5_15']}",
             format_table(["samples", "cache write s (main, once)", "computed s (before)",
                           "recorded s (now)", "before / now"], rows)]
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def main() -> None:
    args = size_arguments(__doc__)
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    start_up_digests(build_index(10_000, 4), accelerator)  # the first gather's imports, not timed
    result = {"machine": machine(), "buckets": args.buckets, "by_samples": {}}
    for n in (int(x) for x in args.samples.split(",")):
        print(f"measuring {n:,} samples...", file=sys.stderr)
        result["by_samples"][str(n)] = measure(n, args.buckets, accelerator)
    largest = result["by_samples"][str(max(map(int, result["by_samples"])))]
    result["targets"] = {
        f"digest + agreement + fingerprint well under {TARGET_SECONDS} s per rank at the "
        "largest size": largest["recorded_seconds"] < TARGET_SECONDS / 10}
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
