"""Writes the skipped-files report of two small indexes into OUT through the real
report_skipped_files_together, called by every rank of a real gloo run.

    torchrun --standalone --nproc_per_node N skipped_files_runner.py OUT

Each rank prints one line, "[rank k] reported <path>" or "[rank k] failed: <error>", and exits
0 or 1."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from accelerate import Accelerator

from simpletuner.common.clean_exit import exit_process
from simpletuner.helpers.metadata.index import DatasetIndex, SkippedFile
from simpletuner.helpers.metadata.startup import report_skipped_files_together

SKIPPED = {"photos": [SkippedFile("bad.png", "truncated or unreadable header")], "art": []}


def main() -> int:
    out = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    indexes = {dataset_id: DatasetIndex(dataset_id, {"64x64": ["kept.png"]},
                                        {"kept.png": (64, 64)}, skipped)
               for dataset_id, skipped in SKIPPED.items()}
    try:
        path = report_skipped_files_together(indexes, out, accelerator)
        say(f"[rank {rank}] reported {path}")
        return 0
    except Exception as exc:
        say(f"[rank {rank}] failed: {exc}")
        return 1
    finally:
        accelerator.end_training()


def say(line: str) -> None:
    # One write: print() writes the text and its newline separately, and two ranks sharing the
    # pipe then interleave as "[rank 0] ...[rank 1] ...\n\n".
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


if __name__ == "__main__":
    exit_process(main())  # after gloo collectives: see clean_exit.py
