"""What the UI shows of a run, read from the run's own files: training_status.json (the
trainer's status and message), the last step of events.jsonl or training_steps.jsonl, and the
end of console.log. Never written here: the run owns them."""

from __future__ import annotations

import json
from pathlib import Path

from simpletuner.training.reporting.events import EVENTS_FILE
from simpletuner.training.reporting.report_data import OLD_STEP_LOG as STEP_LOG
from simpletuner.training.reporting.run_log import STATUS_FILE
from simpletuner.training.run.outcomes import (EXIT_CONFIG, EXIT_DIVERGED, EXIT_FAILED,
                                               EXIT_PREEMPTED, EXIT_TRAINED)

EVENTS_NAME = EVENTS_FILE
TAIL_BYTES = 64 * 1024
STATES_BY_EXIT = {EXIT_TRAINED: "finished", EXIT_PREEMPTED: "preempted",
                  EXIT_DIVERGED: "diverged"}


def output_of(run_folder: Path) -> Path:
    return run_folder / "output"


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def training_status(run_folder: Path) -> dict | None:
    return read_json(output_of(run_folder) / STATUS_FILE)


def tail_lines(path: Path, count: int) -> list[str]:
    """The last ``count`` lines of a file (its last 64 KiB read), [] when it does not exist."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - TAIL_BYTES))
            text = file.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.replace("\r", "\n").splitlines()[-count:]


def last_step(run_folder: Path) -> int | None:
    """The newest step the run logged: events.jsonl's, else the step log's, else the status's."""
    output = output_of(run_folder)
    for log in (EVENTS_NAME, STEP_LOG):
        for line in reversed(tail_lines(output / log, 50)):
            try:
                step = json.loads(line).get("step")
            except (ValueError, AttributeError):
                continue
            if isinstance(step, int):
                return step
    status = training_status(run_folder) or {}
    return status.get("step") if isinstance(status.get("step"), int) else None


def max_steps(run_folder: Path) -> int | None:
    status = training_status(run_folder) or {}
    if isinstance(status.get("total_steps"), int):
        return status["total_steps"]
    value = (read_json(run_folder / "config.json") or {}).get("max_train_steps")
    return value if isinstance(value, int) else None


def ending(run_folder: Path, exit_status: int | None) -> tuple[str, int | None, str | None]:
    """(state, exit status, message) of a run whose process is gone. The status is the one
    the wrapper recorded (or the server saw); without one, the trainer's own status file's."""
    status = training_status(run_folder) or {}
    if exit_status is None and isinstance(status.get("exit_status"), int):
        exit_status = status["exit_status"]
    if exit_status is None and status.get("status") == "failed":
        exit_status = EXIT_FAILED
    state = STATES_BY_EXIT.get(exit_status, "failed")
    if state == "finished":
        return state, exit_status, None
    message = status.get("message") if status.get("status") not in (None, "running") else None
    if exit_status is None:
        message = "the run's processes ended without an exit status (killed?)"
    elif exit_status == EXIT_CONFIG and not message:
        message = "configuration problem"
    tail = "\n".join(tail_lines(run_folder / "console.log", 20))
    return state, exit_status, "\n".join(part for part in (message, tail) if part) or None
