"""`python -m simpletuner report OUTPUT_DIR`: the run report rendered again from what the run
left in OUTPUT_DIR, its checkpoints verified file by file (SHA-256)."""

from __future__ import annotations

import sys
from pathlib import Path

from simpletuner.training.reporting.report_page import render_report
from simpletuner.training.reporting.run_log import STATUS_FILE, STEP_LOG

# Any of these shows that a training run wrote into the folder.
RUN_FILES = (STATUS_FILE, STEP_LOG, "training_summary.json", "skipped_files.json")


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
        path = render_report(folder, verify_hashes=True)
    except OSError as exc:
        print(f"report: could not write the report in {folder}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
