"""`POST /api/plan`: what `python -m simpletuner plan --json` says of a configuration before
it is queued (its buckets, skipped files, and the split: optimizer steps and micro-batches per
epoch at a number of processes), run as its own bounded process on the two files the check
wrote, summarised for the page; and, when asked with a device's GiB, `plan --memory`'s table
and its "fits" line (it loads the model's description with torch, so it costs seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from simpletuner.ui.checking import CONFIG_NAME

PLAN_TIMEOUT_S = 120  # reading many headers the first time takes a while; never forever
MAX_PROCESSES = 64


class PlanFailed(RuntimeError):
    """plan ended without its JSON (a timeout, a crash): the message says how."""


def _plan_output(repo: Path, folder: Path, *options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "simpletuner", "plan", *options, "--config",
               str(folder / CONFIG_NAME)]
    try:
        return subprocess.run(command, cwd=repo, capture_output=True, text=True,
                              timeout=PLAN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PlanFailed(f"plan took longer than {PLAN_TIMEOUT_S} s") from None


def run_plan(repo: Path, folder: Path, processes: int) -> dict:
    """plan's JSON for ``folder``'s config.json (written by ``problems_of``), summarised."""
    result = _plan_output(repo, folder, "--json", "--num-processes", str(processes))
    try:
        plan = json.loads(result.stdout)
    except ValueError:
        raise PlanFailed(f"plan failed ({result.returncode}): "
                         f"{result.stderr.strip()[-2000:]}") from None
    return summary(plan)


def run_memory_plan(repo: Path, folder: Path, processes: int, gpu_memory: float) -> dict:
    """`plan --memory --gpu-memory`: its text, and its verdict line ("fits in ..." or "does
    not fit in ..."; None for a family whose activations it does not estimate)."""
    result = _plan_output(repo, folder, "--memory", "--gpu-memory", f"{gpu_memory:g}",
                          "--num-processes", str(processes))
    if result.returncode != 0:
        raise PlanFailed(f"plan --memory failed ({result.returncode}): "
                         f"{result.stderr.strip()[-2000:]}")
    verdict = next((line for line in result.stdout.splitlines()
                    if line.startswith(("fits in", "does not fit in"))), None)
    return {"text": result.stdout, "verdict": verdict}


def summary(plan: dict) -> dict:
    """Per dataset its bucket sizes and skipped count; the split's steps per epoch."""
    datasets = {
        dataset_id: {"buckets": {bucket: len(files) for bucket, files in
                                 (entry.get("buckets") or {}).items()},
                     "skipped": len(entry.get("skipped") or [])}
        for dataset_id, entry in (plan.get("datasets") or {}).items()}
    split = plan.get("split") or {}
    return {"datasets": datasets, "num_processes": split.get("num_processes"),
            "optimizer_steps_per_epoch": split.get("optimizer_steps_per_epoch"),
            "micro_batches_per_epoch": split.get("micro_batches_per_epoch"),
            "problem": split.get("problem")}


def processes_of(body) -> int:
    value = body.get("processes", 1) if isinstance(body, dict) else 1
    return value if type(value) is int and 1 <= value <= MAX_PROCESSES else 1


def gpu_memory_of(body) -> float | None:
    """The GiB the memory plan is asked for; None: no memory plan."""
    value = body.get("gpu_memory") if isinstance(body, dict) else None
    return float(value) if type(value) in (int, float) and 0 < value <= 4096 else None
