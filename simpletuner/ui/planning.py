"""`POST /api/plan`: what `python -m simpletuner plan --json` says of a configuration before
it is queued (its buckets, skipped files, and the split: optimizer steps and micro-batches per
epoch at a number of processes), run as its own bounded process on the two files the check
wrote, summarised for the page."""

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


def run_plan(repo: Path, folder: Path, processes: int) -> dict:
    """plan's JSON for ``folder``'s config.json (written by ``problems_of``), summarised."""
    command = [sys.executable, "-m", "simpletuner", "plan", "--json", "--num-processes",
               str(processes), "--config", str(folder / CONFIG_NAME)]
    try:
        result = subprocess.run(command, cwd=repo, capture_output=True, text=True,
                                timeout=PLAN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PlanFailed(f"plan took longer than {PLAN_TIMEOUT_S} s") from None
    try:
        plan = json.loads(result.stdout)
    except ValueError:
        raise PlanFailed(f"plan failed ({result.returncode}): "
                         f"{result.stderr.strip()[-2000:]}") from None
    return summary(plan)


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
