"""Parquet metadata: the project's index build from a table, against pyarrow reading it.

    python benchmarks/bench_parquet.py [--rows 1000000] [--buckets 40] [--repeats 5] [--json]
    python benchmarks/bench_parquet.py --plan-absent [--rows 10000000] [--kept 100000] [--json]

A generated table (kept in $SIMPLETUNER_CACHE/benchmarks) of N rows: file name, width, height
(40 aspect buckets) and caption. Each side runs in a fresh process, --repeats times, the sides
taking turns (pyarrow, cold, pyarrow shuffled, shuffled, warm, load, pyarrow, ...) so that each
meets the machine in the same states; the table gives each side's median and its fastest run,
and the ratios and targets compare medians, each build with pyarrow's read of its own table. On a VM most of pyarrow's own read is the kernel handing the process
new memory, which varies from run to run by more than 2x: a best-of-N of pyarrow alone would
compare with its luckiest run.

* pyarrow: ``pyarrow.parquet.read_table`` of the same four columns (nothing else), of the table
  in file-name order and of the shuffled one (which compresses less and reads a little slower);
* cold: ``MetadataBackend.refresh_index`` with an empty cache (read the table, check every row,
  bucket, write the index cache with its captions), caption_strategy 'parquet';
* cold, shuffled: the same over the same rows in random order (the names are then matched to
  the listing through a hash of its names; rows in the listing's order need one comparison);
* warm: the same on the main rank with the cache in place;
* load: ``load_index`` (what every other rank does), which reads the cache only.

The storage is a listing held in memory (built before the clock starts): listing a folder of a
million files is the storage's cost, which benchmarks/bench_discovery.py measures. Memory:
"columns MiB" is pyarrow's table size; "peak MiB" is the peak RSS above the process's RSS before
the measured call (VmHWM, reset first).

--plan-absent: ``python -m simpletuner plan`` as a process over a table of N rows of which all
but --kept name files that are not there (a table written for a bigger folder): each absent row
is a skip. Run twice, cold (no index cache) then warm (the cache in place); for each its time,
its peak RSS (the child's own, from wait4) and the size of what it printed (stdout, stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import data_folder, emit, format_table, machine, parse_with_smoke, peak_rss_mb, \
    ratio, reset_peak_rss, current_rss_mb, verdict

COLUMNS = ["filename", "width", "height", "caption"]
SIDES = ["pyarrow", "cold", "pyarrow-shuffled", "shuffled", "warm", "load"]


def _baseline(side: str) -> str:
    """The pyarrow side a side's ratio is taken to: the read of the same table."""
    return "pyarrow-shuffled" if side.endswith("shuffled") else "pyarrow"


def table_path(rows: int, buckets: int, shuffled: bool = False) -> Path:
    """Rows in file-name order (as a listing is), or in a seeded random order."""
    name = f"table-{rows}-{buckets}{'-shuffled' if shuffled else ''}.parquet"
    path = data_folder("parquet") / name
    if not path.exists():
        import numpy as np
        import pyarrow
        import pyarrow.parquet

        sizes = [(512 + 64 * (k % 8), 512 + 64 * (k // 8)) for k in range(buckets)]
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pyarrow.table({
            "filename": [f"part{i // 1000:04d}/img_{i:07d}.jpg" for i in range(rows)],
            "width": [sizes[i % buckets][0] for i in range(rows)],
            "height": [sizes[i % buckets][1] for i in range(rows)],
            "caption": [f"a photo, number {i}, of a thing in a place" for i in range(rows)]})
        if shuffled:
            table = table.take(np.random.default_rng(0).permutation(rows))
        pyarrow.parquet.write_table(table, path)
    return path


class ListedStorage:
    """The table's files as a storage listing; nothing is ever read from it."""

    remote = False
    max_connections = 1

    def __init__(self, names: list[str]):
        from simpletuner.helpers.data_backend.storage import Listing

        self.location = "memory://listed"
        self.listing = Listing(sorted(names), [100_000] * len(names), [1] * len(names), {})

    def list_files(self):
        return self.listing


def backend_for(table: Path, cache: Path):
    import pyarrow.parquet

    from simpletuner.configuration import DatasetConfig, TrainingConfig
    from simpletuner.helpers.metadata.backends.base import MetadataBackend
    from simpletuner.helpers.metadata.backends.table import TableSource

    names = pyarrow.parquet.read_table(table, columns=["filename"]).column(0).to_pylist()
    dataset = DatasetConfig(id="bench", instance_data_dir="/unused", metadata_backend="parquet",
                            caption_strategy="parquet",
                            parquet={"path": str(table), "caption_column": "caption"})
    training = TrainingConfig(model_family="sdxl", pretrained_model_name_or_path="unused",
                              output_dir=str(cache), data_backend_config="unused",
                              resolution=1024, resolution_type="pixel",
                              aspect_bucket_alignment=64)
    storage = ListedStorage(names)
    return MetadataBackend(dataset, training, storage, cache, TableSource(storage, dataset))


def run_one(side: str, table: Path, cache: Path) -> dict:
    import pyarrow.parquet

    if side.endswith("shuffled"):
        table = table.with_name(table.stem + "-shuffled.parquet")
    reading = side.startswith("pyarrow")
    backend = backend_for(table, cache) if not reading else None
    if side in ("warm", "load"):
        backend.refresh_index(show_progress=False)  # the cache a cold run left
    baseline = current_rss_mb()
    exact = reset_peak_rss()
    start = time.perf_counter()
    if reading:
        table_bytes = pyarrow.parquet.read_table(table, columns=COLUMNS).nbytes
    elif side == "load":
        index = backend.load_index()
    else:
        index = backend.refresh_index(show_progress=False)
    seconds = time.perf_counter() - start
    result = {"seconds": seconds, "peak_mb": peak_rss_mb() - baseline, "exact_peak": exact}
    if reading:
        result["columns_mb"] = table_bytes / 2**20
    else:
        result.update(samples=index.sample_count, buckets=len(index.buckets))
    return result


def run_side(side: str, table: Path, in_process: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        if in_process:  # --smoke: shows the code works, measures nothing
            return run_one(side, table, Path(cache))
        done = subprocess.run([sys.executable, __file__, "--one", side, "--table",
                               str(table), "--cache", cache], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def measure(sides: list[str], table: Path, repeats: int, in_process: bool) -> dict[str, dict]:
    """Every side ``repeats`` times, taking turns; per side the median run's figures, its
    fastest time and the largest peak."""
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for turn in range(repeats):
        for side in sides:
            print(f"measuring {side} ({turn + 1}/{repeats})...", file=sys.stderr)
            runs[side].append(run_side(side, table, in_process))
    summary = {}
    for side, done in runs.items():
        ordered = sorted(done, key=lambda r: r["seconds"])
        median = {**ordered[len(ordered) // 2],
                  "seconds": statistics.median(r["seconds"] for r in done)}
        median.update(fastest=ordered[0]["seconds"], peak_mb=max(r["peak_mb"] for r in done))
        summary[side] = {k: round(v, 3) if isinstance(v, float) else v
                         for k, v in median.items()}
    return summary


def render(result: dict) -> str:
    sides = result["sides"]
    labels = {"pyarrow": "pyarrow read_table (4 columns)", "cold": "project, cold (empty cache)",
              "pyarrow-shuffled": "pyarrow read_table, rows shuffled",
              "shuffled": "project, cold, rows shuffled",
              "warm": "project, warm, main rank", "load": "project, load_index, other ranks"}
    rows = []
    for side, m in sides.items():
        base = sides[_baseline(side)]
        rows.append([labels[side], m["seconds"], m["fastest"], m["peak_mb"],
                     ratio(m["seconds"], base["seconds"]), ratio(m["fastest"], base["fastest"])])
    m = result["machine"]
    lines = [f"Parquet metadata: {result['rows']:,} rows, {result['buckets']} buckets; "
             f"columns {sides['pyarrow']['columns_mb']} MiB; {m['cpus']} CPUs, load "
             f"{m['load_average_1_5_15']}",
             format_table(["", "median s", "fastest s", "peak MiB", "x pyarrow",
                           "x (fastest)"], rows)]
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def absent_setup(rows: int, kept: int) -> Path:
    """A folder of ``kept`` (near empty) image files, a table of ``rows`` rows naming them and
    ``rows - kept`` absent ones (evenly spread), and the datasets file; returns the latter."""
    import numpy as np
    import pyarrow
    import pyarrow.parquet

    root = data_folder("parquet") / f"absent-{rows}-{kept}"
    datasets = root / "multidatabackend.json"
    if datasets.exists():
        return datasets
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    for i in np.linspace(0, rows - 1, kept).astype(np.int64).tolist():
        (images / f"img_{i:08d}.png").write_bytes(b"\x89PNG")  # listed only, never read
    pyarrow.parquet.write_table(pyarrow.table({
        "filename": [f"img_{i:08d}.png" for i in range(rows)],
        "width": np.full(rows, 64, np.int32), "height": np.full(rows, 64, np.int32)}),
        root / "table.parquet")
    datasets.write_text(json.dumps([{
        "id": "absent", "instance_data_dir": str(images), "metadata_backend": "parquet",
        "caption_strategy": "filename",
        "parquet": {"path": str(root / "table.parquet")}}]))
    return datasets


def plan_once(config: Path) -> dict:
    """One ``plan`` process: seconds, its own peak RSS (wait4), bytes printed."""
    with open(config.parent / "stdout", "wb") as out, \
            open(config.parent / "stderr", "wb") as err:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "simpletuner", "plan", "--config",
                                  str(config)], stdout=out, stderr=err, cwd=config.parent)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
    sizes = {f"{name}_bytes": (config.parent / name).stat().st_size
             for name in ("stdout", "stderr")}
    if os.waitstatus_to_exitcode(status) != 0:
        tail = (config.parent / "stderr").read_bytes()[-2000:].decode("utf-8", "replace")
        raise RuntimeError(f"plan exited {os.waitstatus_to_exitcode(status)}:\n{tail}")
    scale = 2**20 if sys.platform == "darwin" else 1024  # ru_maxrss: KiB on Linux
    return {"seconds": round(seconds, 2), "peak_mb": round(usage.ru_maxrss / scale, 1),
            **sizes}


def plan_absent(rows: int, kept: int) -> dict:
    datasets = absent_setup(rows, kept)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": str(Path(tmp) / "out"), "data_backend_config": str(datasets),
            "resolution": 64, "aspect_bucket_alignment": 16}))
        runs = {}
        for run in ("cold", "warm"):  # warm: the index cache the cold run wrote
            print(f"plan over {rows:,} rows, {kept:,} present: {run}...", file=sys.stderr)
            runs[run] = plan_once(config)
    return {"machine": machine(), "rows": rows, "kept": kept, "runs": runs}


def render_absent(result: dict) -> str:
    rows = [[run, m["seconds"], m["peak_mb"], m["stdout_bytes"], m["stderr_bytes"]]
            for run, m in result["runs"].items()]
    m = result["machine"]
    return "\n".join([
        f"plan over a table of {result['rows']:,} rows, {result['kept']:,} of them present; "
        f"{m['cpus']} CPUs, load {m['load_average_1_5_15']}",
        format_table(["plan", "seconds", "peak RSS MiB", "stdout bytes", "stderr bytes"],
                     rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plan-absent", action="store_true",
                        help="plan as a process over a table naming mostly absent files")
    parser.add_argument("--kept", type=int,
                        help="--plan-absent: rows naming a file that is there (1%% of --rows)")
    parser.add_argument("--one", choices=SIDES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--table", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parse_with_smoke(parser, rows=2000, buckets=4, repeats=1, kept=20)
    if args.plan_absent:
        result = plan_absent(args.rows, args.rows // 100 if args.kept is None else args.kept)
        emit(result, args.json, render_absent(result))
        return
    if args.one:  # the child process of measure()
        print(json.dumps(run_one(args.one, Path(args.table), Path(args.cache))))
        return
    table = table_path(args.rows, args.buckets)
    table_path(args.rows, args.buckets, shuffled=True)
    result = {"machine": machine(), "rows": args.rows, "buckets": args.buckets,
              "repeats": args.repeats,
              "sides": measure(SIDES, table, args.repeats, in_process=args.smoke)}
    sides = result["sides"]
    pyarrow_s, columns_mb = sides["pyarrow"]["seconds"], sides["pyarrow"]["columns_mb"]
    result["targets"] = {
        "cold index build within 3x of pyarrow's read (medians; rows in file-name order)":
            sides["cold"]["seconds"] <= 3 * pyarrow_s,
        "cold index build within 3x of pyarrow's read (medians; rows shuffled)":
            sides["shuffled"]["seconds"] <= 3 * sides["pyarrow-shuffled"]["seconds"],
        "warm start under 1 s (main rank and other ranks)":
            max(sides["warm"]["seconds"], sides["load"]["seconds"]) < 1,
        "peak memory of the cold build within 2x of the columns":
            max(sides["cold"]["peak_mb"], sides["shuffled"]["peak_mb"]) <= 2 * columns_mb,
        "every row indexed": sides["cold"]["samples"] == sides["shuffled"]["samples"] == args.rows,
    }
    result["machine_after"] = machine()["load_average_1_5_15"]
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
