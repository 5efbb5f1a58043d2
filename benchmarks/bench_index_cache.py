"""The index cache on every rank: the JSON cache it replaced against the mapped one, and two
other columnar layouts.

    python benchmarks/bench_index_cache.py [--rows 1000000] [--buckets 40] [--repeats 3] [--json]

A synthetic file table of N rows (ids such as 'part0012/img_0012345.jpg', sizes, mtimes,
widths and heights of K buckets), stored four ways; each read runs in a fresh process, best of
--repeats:

* json: the JSON index cache of the versions before issue 29 (written here as they wrote it),
  read as they read it on every rank, then on the main rank only: parse, then the buckets' id
  lists;
* binary: the index cache (index_cache.py) as the main rank writes it, read by ``load_index``
  (size and CRC-32 checked, columns mapped, no id decoded): what every other rank does;
* binary, main warm: the main rank's warm start of a table source: the cache mapped, compared
  with the storage's listing as columns (``same_files``), the index taken as it is. The listing
  is built before the clock starts (listing the storage is its own cost, bench_discovery.py);
* numpy: one .npy file per column, the ids as one NUL-separated UTF-8 blob (NUL is the one
  byte no file name holds) with int64 offsets, bucket rows as one int32 array with offsets;
* arrow: one Arrow IPC file of the same columns (pyarrow), bucket rows as a second table.

"+ split" also splits every bucket for epoch 0 as rank 0 of 8 does (batch 4) and decodes the
ids of its first micro-batch of each: a rank's start-up up to its first batch. For the two
other layouts: "map" opens the columns memory-mapped (nothing parsed), "ids" also makes every
bucket's list of Python str ids. Bytes are the files' sizes on disk; the time each cache took to
write is printed first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchlib import current_rss_mb, emit, format_table, machine, parse_with_smoke, peak_rss_mb, \
    ratio, reset_peak_rss


def synthetic_columns(rows: int, buckets: int) -> dict:
    sizes = [(512 + 64 * (k % 8), 512 + 64 * (k // 8)) for k in range(buckets)]
    which = np.arange(rows) % buckets
    return {"ids": [f"part{i // 1000:04d}/img_{i:07d}.jpg" for i in range(rows)],
            "bytes": (200_000 + np.arange(rows) % 9973).tolist(),
            "change_key": (1_700_000_000_000_000_000 + np.arange(rows) * 1_000).tolist(),
            "width": [sizes[k][0] for k in which.tolist()],
            "height": [sizes[k][1] for k in which.tolist()],
            "rows": {f"{w}x{h}": np.flatnonzero(which == k).tolist()
                     for k, (w, h) in enumerate(sizes)}}


def backend(folder: Path):
    from simpletuner.configuration import DatasetConfig, TrainingConfig
    from simpletuner.helpers.metadata.backends.base import MetadataBackend

    (folder / "data").mkdir(exist_ok=True)
    training = TrainingConfig(model_family="sd1x", pretrained_model_name_or_path="unused",
                              output_dir=str(folder / "out"), data_backend_config="unused.json",
                              resolution=512, aspect_bucket_alignment=64)
    return MetadataBackend.from_config(DatasetConfig(id="bench", instance_data_dir=str(
        folder / "data")), training)


def write_all(folder: Path, rows: int, buckets: int) -> None:
    from simpletuner.helpers.metadata.file_table import FileTable
    from simpletuner.helpers.metadata.index_cache import DIGEST_KEY, cache_columns, cache_meta
    from simpletuner.helpers.metadata.index_history import data_digest
    from simpletuner.helpers.metadata.index_columns import StringColumn

    c = synthetic_columns(rows, buckets)
    b = backend(folder)
    table = FileTable(c["ids"], c["bytes"], c["change_key"], c["width"], c["height"])
    start = time.perf_counter()
    legacy = {"version": 5, "dataset_id": "bench", "files": {
        "ids": c["ids"], "bytes": c["bytes"], "change_key": c["change_key"], "width": c["width"],
        "height": c["height"], "errors": {}}, "index": {"buckets": c["rows"], "skipped": []}}
    b.cache_path.parent.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(legacy))
    json_written = time.perf_counter()
    # what refresh_index writes
    columns = cache_columns(table, StringColumn.encode(table.ids), c["rows"], None)
    digests = {DIGEST_KEY: data_digest(columns, table, c["rows"], []),
               "index_digest": "not hashed"}
    meta = cache_meta("bench", b._file_entries_key(), b.settings(), table, c["rows"], [], digests)
    with b.history.new_version(None) as version:
        version.add(columns)
        b.history.commit_if_changed(version, meta, None)
    print(f"written: JSON {json_written - start:.2f} s, index cache "
          f"{time.perf_counter() - json_written:.2f} s", file=sys.stderr)
    keys = sorted(c["rows"])
    bucket_rows = np.concatenate([np.asarray(c["rows"][k], dtype=np.int32) for k in keys])
    bucket_offsets = np.cumsum([0] + [len(c["rows"][k]) for k in keys]).astype(np.int64)
    blob = "\0".join(c["ids"]).encode("utf-8", "surrogateescape")
    offsets = np.cumsum([0] + [len(s.encode("utf-8")) + 1 for s in c["ids"]]).astype(np.int64)
    numpy_dir = folder / "numpy"
    numpy_dir.mkdir()
    for name, values in (("ids", np.frombuffer(blob, dtype=np.uint8)), ("offsets", offsets),
                         ("bytes", np.asarray(c["bytes"], np.int64)),
                         ("change_key", np.asarray(c["change_key"], np.int64)),
                         ("width", np.asarray(c["width"], np.int32)),
                         ("height", np.asarray(c["height"], np.int32)),
                         ("bucket_rows", bucket_rows), ("bucket_offsets", bucket_offsets)):
        np.save(numpy_dir / f"{name}.npy", values)
    (numpy_dir / "buckets.json").write_text(json.dumps(keys))
    import pyarrow as pa

    files = pa.table({"ids": c["ids"], "bytes": c["bytes"], "change_key": c["change_key"],
                      "width": pa.array(c["width"], pa.int32()),
                      "height": pa.array(c["height"], pa.int32())})
    bucket_names = pa.array([k for k in keys for _ in c["rows"][k]]).dictionary_encode()
    groups = pa.table({"bucket": bucket_names, "row": pa.array(bucket_rows)})
    for name, table in (("files", files), ("buckets", groups)):
        with pa.OSFile(str(folder / f"{name}.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)


def read_numpy(folder: Path, with_ids: bool) -> int:
    d = folder / "numpy"
    cols = {p.stem: np.load(p, mmap_mode="r") for p in d.glob("*.npy")}
    if not with_ids:
        return int(cols["width"].shape[0])
    ids = cols["ids"].tobytes().decode("utf-8", "surrogateescape").split("\0")
    keys, rows, offsets = json.loads((d / "buckets.json").read_text()), cols["bucket_rows"], \
        cols["bucket_offsets"]
    buckets = {k: list(map(ids.__getitem__, rows[offsets[i]:offsets[i + 1]].tolist()))
               for i, k in enumerate(keys)}
    return sum(map(len, buckets.values()))


def read_arrow(folder: Path, with_ids: bool) -> int:
    import pyarrow as pa

    files = pa.ipc.open_file(pa.memory_map(str(folder / "files.arrow"))).read_all()
    groups = pa.ipc.open_file(pa.memory_map(str(folder / "buckets.arrow"))).read_all()
    if not with_ids:
        return files.num_rows
    ids = files.column("ids").to_pylist()
    bucket = groups.column("bucket").combine_chunks()
    rows = groups.column("row").to_numpy()
    keys = bucket.dictionary.to_pylist()
    codes = bucket.indices.to_numpy()
    return sum(len(list(map(ids.__getitem__, rows[codes == k].tolist())))
               for k in range(len(keys)))


def first_batches(cache_reader, index) -> int:
    """Rank 0 of 8's epoch 0 of every bucket, and its first micro-batch's ids."""
    slices = cache_reader.split_buckets_between_processes(index, seed=1, epoch=0, processes=8,
                                                          rank=0, accumulation=1)
    decoded = sum(len(s.micro_batch(0)) for s in slices.values())
    return index.sample_count if decoded == 4 * len(slices) else -1


def read_legacy_json(folder: Path):
    """The JSON cache read as the versions before issue 29 read it: parsed, then each bucket's
    rows turned into its list of ids."""
    from simpletuner.helpers.metadata.index import DatasetIndex
    from simpletuner.helpers.metadata.split import SortedIds

    cache = json.loads((folder / "bench.json").read_text())
    ids = cache["files"]["ids"]
    buckets = {key: SortedIds(map(ids.__getitem__, rows))
               for key, rows in cache["index"]["buckets"].items()}
    return DatasetIndex("bench", buckets, {})


def main_rank_warm(cache_reader, listing):
    """refresh_index's warm start for a table source, less the listing (given): the cache
    mapped, its key, settings and files compared, the index taken as it is."""
    from simpletuner.helpers.metadata.index_cache import load_cache

    cached = load_cache(cache_reader.cache_path)
    if not (cached.meta["files_key"] == cache_reader._file_entries_key()
            and cache_reader._cache_problem(cached) is None and cached.same_files(listing)):
        raise RuntimeError("the warm start did not take the cache")
    return cache_reader._take_cached(cached)


def run_one(way: str, folder: Path, rows: int, buckets: int) -> dict:
    """Imports, the backend's construction and a listing happen before the clock starts."""
    if way.startswith(("json", "binary")):
        cache_reader = backend(folder)
        cache_reader.dataset = replace(cache_reader.dataset, train_batch_size=4)
        load = cache_reader.load_index
        if way.startswith("json"):
            load = lambda: read_legacy_json(folder)  # noqa: E731
        elif "main warm" in way:
            from simpletuner.helpers.data_backend.storage import Listing

            c = synthetic_columns(rows, buckets)
            listing = Listing(c["ids"], c["bytes"], c["change_key"], {})
            del c
            load = lambda: main_rank_warm(cache_reader, listing)  # noqa: E731
        if way.endswith("split"):
            reader = lambda: first_batches(cache_reader, load())  # noqa: E731
        else:
            reader = lambda: load().sample_count  # noqa: E731
    else:
        if way.startswith("arrow"):
            import pyarrow  # noqa: F401
        read = read_numpy if way.startswith("numpy") else read_arrow
        reader = lambda: read(folder, way.endswith("ids"))  # noqa: E731
    before = current_rss_mb()
    reset_peak_rss()
    start = time.perf_counter()
    count = reader()
    return {"seconds": time.perf_counter() - start, "count": count,
            "peak_mb": peak_rss_mb() - before}


WAYS = ("json", "json + split", "binary", "binary + split", "binary main warm",
        "binary main warm + split", "numpy map", "numpy ids", "arrow map", "arrow ids")


def on_disk(folder: Path, way: str) -> int:
    if way.startswith("json"):
        return (folder / "bench.json").stat().st_size
    if way.startswith("binary"):
        return (folder / "out/cache/metadata/bench.index").stat().st_size
    if way.startswith("numpy"):
        return sum(p.stat().st_size for p in (folder / "numpy").iterdir())
    return sum((folder / f"{n}.arrow").stat().st_size for n in ("files", "buckets"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of: "
                        + ", ".join(WAYS))
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parse_with_smoke(parser, rows=2000, buckets=4, repeats=1)
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.folder), args.rows, args.buckets)))
        return
    result = {"machine": machine(), "rows": args.rows, "buckets": args.buckets, "ways": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"writing {args.rows:,} rows four ways...", file=sys.stderr)
        write_all(folder, args.rows, args.buckets)
        for way in args.ways.split(","):
            runs = [run_one(way, folder, args.rows, args.buckets) if args.smoke
                    else json.loads(subprocess.run(
                        [sys.executable, __file__, "--one", way, "--folder", tmp, "--rows",
                         str(args.rows), "--buckets", str(args.buckets)], check=True,
                        capture_output=True, text=True).stdout) for _ in range(args.repeats)]
            if {r["count"] for r in runs} != {args.rows}:
                raise RuntimeError(f"{way} read {runs[0]['count']} rows, not {args.rows}")
            result["ways"][way] = {"seconds": round(min(r["seconds"] for r in runs), 4),
                                   "peak_mb": round(max(r["peak_mb"] for r in runs), 1),
                                   "bytes": on_disk(folder, way)}
    base = result["ways"]["json"]["seconds"]
    rows = [[way, m["seconds"], ratio(base, m["seconds"]), m["peak_mb"], m["bytes"]]
            for way, m in result["ways"].items()]
    text = "\n".join([
        f"Index cache read by a rank: {args.rows:,} rows, {args.buckets} buckets; "
        f"{result['machine']['cpus']} CPUs, load {result['machine']['load_average_1_5_15']}",
        format_table(["", "seconds", "json / this", "peak MiB", "bytes"], rows)])
    emit(result, args.json, text)


if __name__ == "__main__":
    main()
