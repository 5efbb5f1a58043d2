"""Read many image headers: in this process for a few files, in worker processes for many.

Why processes, not threads: a header read is a little Python work between many small system
calls (open, read, fstat, seek, close), and with the GIL a thread coming back from each call
waits for the others: more threads read headers slower than one, while processes read them
faster (figures: benchmarks/PERFORMANCE.md, bench_discovery.py).

Why plain ``python -m`` subprocesses, not a multiprocessing pool: a spawned pool re-imports the
launching module in every worker (for the trainer that is torch and diffusers, seconds each),
and forking a process that already runs threads is unsafe. A worker gets its paths as JSON on
stdin and answers JSON lines on stdout; if one dies, this process reads the rest of its share.

Run as a module, this file is that worker.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from PIL import Image
from tqdm import tqdm

from simpletuner.common.cores import usable_cores
from simpletuner.helpers.metadata.backends.discovery import Probe, probe_image

logger = logging.getLogger(__name__)

# A worker's start-up (Python and Pillow) pays off from about this many files per worker
# (workers=1 against workers=2: benchmarks/PERFORMANCE.md).
MIN_FILES_PER_WORKER = 2500
MAX_WORKERS = 8
REPORT_EVERY = 64  # probes per line a worker writes: the progress bar's granularity


def default_workers(count: int) -> int:
    """Worker processes for ``count`` headers: one per usable core, none for small jobs."""
    return max(1, min(usable_cores(), MAX_WORKERS, count // MIN_FILES_PER_WORKER))


def probe_images(paths: Sequence[str], *, max_pixels: int | None, workers: int | None = None,
                 show_progress: bool = True,
                 description: str = "reading image headers") -> list[Probe]:
    """Probe every path; results are in the order of ``paths``.

    ``max_pixels`` is the decompression-bomb limit (pass ``Image.MAX_IMAGE_PIXELS``; None =
    none). ``workers``: 1 reads in this process, more start that many worker processes;
    None chooses by the number of paths (``default_workers``).
    """
    workers = min(workers or default_workers(len(paths)), max(1, len(paths)))
    with _quiet_pillow(), tqdm(total=len(paths), desc=description, unit="img",
                               disable=not show_progress) as bar:
        if workers == 1:
            return _probe_here(paths, max_pixels, bar.update)
        lock = threading.Lock()

        def progress(done: int) -> None:
            with lock:
                bar.update(done)

        shares = [list(paths[i::workers]) for i in range(workers)]  # similar work in each
        with ThreadPoolExecutor(workers) as pool:  # threads that only wait on the workers
            answers = list(pool.map(lambda share: _probe_in_worker(share, max_pixels, progress),
                                    shares))
    results: list[Probe] = [Probe()] * len(paths)
    for i, answer in enumerate(answers):
        results[i::workers] = answer
    return results


@contextmanager
def _quiet_pillow() -> Iterator[None]:
    """Broken files are reported as skips, not as Pillow warnings. Entered once per process
    (here or in the worker), never from the threads: warning filters are process-global."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
        yield


def _probe_chunks(paths: Sequence[str], max_pixels: int | None) -> Iterator[list[Probe]]:
    """Probes of ``paths``, REPORT_EVERY at a time."""
    for start in range(0, len(paths), REPORT_EVERY):
        yield [probe_image(path, max_pixels) for path in paths[start:start + REPORT_EVERY]]


def _probe_here(paths: Sequence[str], max_pixels: int | None,
                progress: Callable[[int], None]) -> list[Probe]:
    results: list[Probe] = []
    for probes in _probe_chunks(paths, max_pixels):
        results.extend(probes)
        progress(len(probes))
    return results


def _worker_command() -> list[str]:
    # -P: the working directory does not go on sys.path, so a folder there cannot shadow a module
    return [sys.executable, "-P", "-m", __name__]


def _probe_in_worker(paths: list[str], max_pixels: int | None,
                     progress: Callable[[int], None]) -> list[Probe]:
    # The worker must import this package wherever it is installed (or just checked out).
    package_parent = str(Path(__file__).resolve().parents[4])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_parent, os.environ.get("PYTHONPATH")) if p))
    results: list[Probe] = []
    worker = subprocess.Popen(_worker_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env)
    # ASCII JSON: paths that are not valid UTF-8 travel as escaped surrogates.
    _send(worker, json.dumps({"max_pixels": max_pixels, "paths": paths}).encode())
    try:
        for line in worker.stdout:
            answered = [Probe(*row) for row in json.loads(line)]
            results.extend(answered)
            progress(len(answered))
    except ValueError:  # a torn last line from a worker that died mid-write
        pass
    finally:
        worker.stdout.close()
        status = worker.wait()
    if len(results) < len(paths):
        logger.warning("a header-reading worker stopped after %d of %d files (exit status %s); "
                       "reading the rest in the main process", len(results), len(paths), status)
        results.extend(_probe_here(paths[len(results):], max_pixels, progress))
    return results


def _send(worker: subprocess.Popen, payload: bytes) -> None:
    """Write the request and close stdin; a worker already gone is noticed by its answers."""
    try:
        worker.stdin.write(payload)
    except OSError:
        pass
    try:
        worker.stdin.close()
    except OSError:
        pass


def _worker_main() -> None:
    request = json.load(sys.stdin)
    Image.MAX_IMAGE_PIXELS = request["max_pixels"]  # Pillow's own check, as in the parent
    with _quiet_pillow():
        for probes in _probe_chunks(request["paths"], request["max_pixels"]):
            sys.stdout.write(json.dumps([[p.width, p.height, p.error] for p in probes]) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    _worker_main()
