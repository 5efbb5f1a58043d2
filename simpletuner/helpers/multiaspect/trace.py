"""Per-rank sample traces: one JSON line per micro-batch, written by the audit and by training.

``<folder>/rank-<k>.jsonl`` holds ``{"epoch", "step", "dataset", "bucket", "samples"}`` per line,
and ``"stand_in": true`` for an evaluation micro-batch that only keeps its rank in step, and for
edit pairs ``"references"``: each sample's reference ids, in the order of ``samples``; with
context parallel ``"group"``: the rank's data-parallel group (helpers/metadata/mesh.py).
Lines are flushed as they are written, so a crashed run still shows how far each rank got.
A resumed run first cuts the trace back to the lines before its position (a crashed run wrote
past its last checkpoint), so the trace ends up equal to the uninterrupted run's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from simpletuner.common.jsonl_log import keep_leading_records
from simpletuner.helpers.multiaspect.batch import MicroBatch


def trace_path(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.jsonl"


def trace_record(batch: MicroBatch, group: int | None = None) -> dict:
    record = {"epoch": batch.epoch, "step": batch.step, "dataset": batch.dataset_id,
              "bucket": batch.bucket, "samples": [s.sample_id for s in batch.samples]}
    if group is not None:  # context parallel: the rank's data-parallel group
        record["group"] = group
    if any(s.references for s in batch.samples):  # edit pairs: each sample's reference ids
        record["references"] = [list(s.references) for s in batch.samples]
    if batch.stand_in:
        record["stand_in"] = True
    return record


def truncate_trace(path: Path, position: tuple[int, int]) -> None:
    """Keep the lines before ``position`` = (epoch, micro-batch index), atomically (a damaged
    line, and every line after it, goes too)."""
    keep_leading_records(path, lambda record: (int(record["epoch"]), int(record["step"]))
                         < position)


class TraceWriter:
    """Writes this rank's trace; ``resume_at=(epoch, step)`` continues a resumed run's trace
    after cutting it back to the lines before that position."""

    def __init__(self, folder: str | os.PathLike, rank: int, *,
                 resume_at: tuple[int, int] | None = None, group: int | None = None):
        self.path = trace_path(folder, rank)
        self.group = group
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_at is not None:
            truncate_trace(self.path, resume_at)
        self._file: IO[str] = open(self.path, "w" if resume_at is None else "a", encoding="utf-8")

    def write(self, batch: MicroBatch) -> None:
        self._file.write(json.dumps(trace_record(batch, self.group), separators=(",", ":"))
                         + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trace(folder: str | os.PathLike, rank: int) -> list[dict]:
    """One rank's records; a missing or damaged file raises ValueError naming file and line."""
    path = trace_path(folder, rank)
    if not path.is_file():
        raise ValueError(f"{path}: trace of rank {rank} not found (did that rank finish?)")
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                record = json.loads(line)
                records.append({"epoch": int(record["epoch"]), "step": int(record["step"]),
                                "dataset": str(record["dataset"]),
                                "bucket": str(record["bucket"]),
                                "samples": [str(s) for s in record["samples"]],
                                "references": [[str(r) for r in refs]
                                               for refs in record.get("references", [])],
                                "stand_in": record.get("stand_in", False) is True,
                                **({"group": int(record["group"])} if "group" in record
                                   else {})})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path} line {number}: not a trace record ({exc})") from None
    return records
