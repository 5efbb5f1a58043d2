"""Sampler state in a checkpoint: its size and save/load time, against carrying the sample lists.

    python benchmarks/bench_sampler_state.py [--samples 1000000,10000000] [--buckets 40] [--json]

A synthetic bucket index (ids such as 'part00012/img_00012345.jpg', 1000 per folder, K buckets
of uneven size) and the real MultiAspectSampler for rank 0 of 8. Two sides, same process, one
after the other:

* previous: the state as it was until the sample lists left it: position, fingerprint and every
  sample id, grouped by folder (``{dataset: {bucket: {folder: [file names]}}}``);
* project: position, fingerprint and one index cache digest per dataset (the files come from
  the index caches on disk, helpers/metadata/index_history.py).

Per side: the bytes of sampler_state.json; a save (state_dict, the atomic JSON write, the
SHA-256 the checkpoint manifest takes of the file); a load (read, parse, load_state_dict on a
fresh sampler over the same data). The first save of a run also hashes every id once for the
fingerprint (the index digest): shown apart, since it is paid once per run, by both sides.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchlib import emit, format_table, machine, parse_with_smoke, ratio, verdict
from simpletuner.common.atomic import atomic_write_json
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.index_history import IndexHistory, IndexVersion
from simpletuner.helpers.metadata.split import SortedIds
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

TARGET_BYTES = 16 * 1024  # the bound on a checkpoint's sampler state


def build_index(samples: int, buckets: int) -> DatasetIndex:
    """Ids made in sorted order and appended to their bucket, as load_index does."""
    weights = np.array([1 / (k + 1) for k in range(buckets)])
    keys = [f"{512 + 64 * (k % 16)}x{512 + 64 * (k // 16)}" for k in range(buckets)]
    assignment = np.random.default_rng(0).choice(buckets, size=samples, p=weights / weights.sum())
    lists: dict[str, list[str]] = {key: [] for key in keys}
    for i, k in enumerate(assignment.tolist()):
        lists[keys[k]].append(f"part{i // 1000:05d}/img_{i:08d}.jpg")
    return DatasetIndex("bench", {key: SortedIds(ids) for key, ids in lists.items()}, {})


def previous_state(sampler: MultiAspectSampler) -> dict:
    """The state with the sample lists, as sampler.py wrote it before (the baseline)."""
    lists = {}
    for d in sampler.datasets:
        per_bucket = {}
        for key, ids in sorted(d.index.buckets.items()):
            grouped: dict[str, list[str]] = {}
            for sample_id in ids:
                folder, _, name = sample_id.rpartition("/")
                grouped.setdefault(folder, []).append(name)
            per_bucket[key] = grouped
        lists[d.index.dataset_id] = per_bucket
    state = sampler.state_dict()
    state.pop("data")
    return {**state, "samples": lists}


def new_sampler(index: DatasetIndex, history: IndexHistory) -> MultiAspectSampler:
    dataset = SamplerDataset(index, str, 4, version=IndexVersion("0" * 64, history))
    return MultiAspectSampler([dataset], seed=1234, processes=8, rank=0, accumulation=1)


def save(path: Path, state_of) -> float:
    start = time.perf_counter()
    atomic_write_json(path, state_of())
    hashlib.sha256(path.read_bytes()).hexdigest()  # the manifest's
    return time.perf_counter() - start


def load(path: Path, index: DatasetIndex, history: IndexHistory) -> float:
    resumed = new_sampler(index, history)
    resumed.fingerprint()  # the index digest: paid once per run whatever the state holds
    start = time.perf_counter()
    resumed.load_state_dict(json.loads(path.read_text(encoding="utf-8")))
    return time.perf_counter() - start


def measure(samples: int, buckets: int, folder: Path) -> dict:
    index = build_index(samples, buckets)
    history = IndexHistory(folder / "cache.json", "bench")
    sampler = new_sampler(index, history)
    next(iter(sampler))
    start = time.perf_counter()
    sampler.fingerprint()
    first = time.perf_counter() - start
    result = {"index_digest_seconds": round(first, 3)}
    for side, state_of in (("previous", lambda: previous_state(sampler)),
                           ("project", sampler.state_dict)):
        path = folder / f"{side}-{samples}.json"
        seconds = min(save(path, state_of) for _ in range(3))
        result[side] = {"bytes": path.stat().st_size, "save_seconds": round(seconds, 4),
                        "load_seconds": round(min(load(path, index, history)
                                                  for _ in range(3)), 4)}
        path.unlink()
    del index, sampler
    gc.collect()
    return result


def render(result: dict) -> str:
    rows = []
    for n, m in result["by_samples"].items():
        for side in ("previous", "project"):
            rows.append([f"{side}, {int(n):,}", m[side]["bytes"], m[side]["save_seconds"],
                         m[side]["load_seconds"],
                         ratio(m["previous"]["bytes"], m[side]["bytes"])])
    digests = ", ".join(f"{int(n):,}: {m['index_digest_seconds']} s"
                        for n, m in result["by_samples"].items())
    lines = [f"Sampler state: {result['buckets']} buckets, rank 0 of 8; "
             f"{result['machine']['cpus']} CPUs, load {result['machine']['load_average_1_5_15']}",
             format_table(["", "bytes", "save s", "load s", "previous / this size"], rows),
             f"index digest for the fingerprint, once per run (both sides): {digests}"]
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def size_arguments(doc: str) -> argparse.Namespace:
    """--samples (a list of sizes), --buckets, --json: this benchmark's, and
    bench_index_digest.py's over the same synthetic index."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="1000000,10000000",
                        help="comma-separated dataset sizes")
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    return parse_with_smoke(parser, samples="2000", buckets=4)


def main() -> None:
    args = size_arguments(__doc__)
    result = {"machine": machine(), "buckets": args.buckets, "by_samples": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.samples.split(",")):
            print(f"measuring {n:,} samples...", file=sys.stderr)
            result["by_samples"][str(n)] = measure(n, args.buckets, Path(tmp))
    sizes = [m["project"]["bytes"] for m in result["by_samples"].values()]
    result["targets"] = {
        f"project state under {TARGET_BYTES // 1024} KiB at every size": max(sizes) < TARGET_BYTES,
        "project state the same size at every dataset size": len(set(sizes)) == 1,
    }
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
