"""`python -m simpletuner report OUTPUT_DIR`: the run report rendered again from what the run
left in OUTPUT_DIR, its checkpoints verified file by file (SHA-256). A run that says it is
running while no process holds output_dir's lock was killed without a word (SIGKILL, out of
memory, a lost machine): the page says so."""

from __future__ import annotations

import sys
from pathlib import Path

from simpletuner.common.names import printable
from simpletuner.training.reporting.events import EVENTS_FILE, SKIPPED_FILES
from simpletuner.training.reporting.report_data import OLD_STEP_LOG, ReportData, read_report_data
from simpletuner.training.reporting.report_page import write_report
from simpletuner.training.reporting.run_log import STATUS_FILE
from simpletuner.training.run.output_dir_lock import OutputDirLock

# Any of these shows that a training run wrote into the folder (an older run: its step log).
RUN_FILES = (STATUS_FILE, EVENTS_FILE, "training_summary.json", SKIPPED_FILES, OLD_STEP_LOG)


def run_report_command(output_dir: str) -> int:
    folder = Path(output_dir)
    if not folder.is_dir():
        print(f"report: {folder} is not a folder; give a run's output_dir", file=sys.stderr)
        return 2
    if not any((folder / name).is_file() for name in RUN_FILES):
        print(f"report: {folder} holds none of {', '.join(RUN_FILES)}; is it a run's "
              "output_dir?", file=sys.stderr)
        return 2
    try:
        data = read_report_data(folder, verify_hashes=True)
        if data.status.get("status") in ("starting", "running"):
            mark_if_killed(data)
        path = write_report(data)
    except OSError as exc:
        print(printable(f"report: could not write the report in {folder}: {exc}"),
              file=sys.stderr)
        return 1
    print(printable(str(path)))
    return 0


def mark_if_killed(data: ReportData) -> None:
    """The shown status (training_status.json is left as the run wrote it)."""
    if OutputDirLock(data.output_dir).in_use_problem() is not None:
        return  # a run holds the lock: it is running
    step = data.steps[-1]["step"] if data.steps else data.status.get("step", 0)
    data.status = dict(data.status, status="killed", message=(
        f"{STATUS_FILE} says the run was {data.status['status']} (step {step}), but no process "
        "holds output_dir's lock: it was killed without a word (SIGKILL, out of memory, a lost "
        "machine). Run again with resume_from_checkpoint 'latest' to continue from the last "
        "checkpoint."))
