"""``output_dir/events.jsonl``: the run's history, one JSON object a line (docs/EVENTS.md): its
start, every step, evaluation, validation and checkpoint, the files skipped, status changes and
its end. Every line has ``type``, ``step`` and a wall-clock ``time``.

Written by the main rank only, appended and flushed line by line, so a live view can tail it.
Once the run knows the step it starts from, the lines of later steps are cut away
(common/jsonl_log.py): a run killed after its last checkpoint wrote them, and the resumed run
writes those steps again, so each step is in the file once, in order. Like the rest of the run
report it never stops the training: a failed write is a warning, and no line is written after
it (a reader stops at a torn line anyway, and a hole would read as a complete history).
Torch-free: the report reads it.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from simpletuner.common.jsonl_log import keep_leading_records

logger = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
SKIPPED_FILES = "skipped_files.json"
SKIPPED_SUMMARY = "skipped_summary.json"  # by reason: counts, first names (startup.py writes)
SKIPS_NAMED = 5  # skipped files named in the line (it stays short); skipped_files.json has all


def _finite_or_none(value: float) -> float | None:
    """NaN and infinity are not JSON: a non-finite number is null."""
    value = float(value)
    return value if math.isfinite(value) else None


class EventLog:
    """Writes nothing on other ranks, nor before ``open`` (the preflight accepted output_dir
    and the resume step is known: a refused output_dir may be a dataset's folder)."""

    def __init__(self, output_dir: Path, *, main: bool):
        self.output_dir, self.main = Path(output_dir), main
        self.path = self.output_dir / EVENTS_FILE
        self.writing = False
        self._started = time.monotonic()  # a step's elapsed: seconds into this attempt

    def open(self, resume_step: int) -> None:
        """Keep the lines up to ``resume_step`` (0 for a fresh run: an earlier attempt's
        start and end before its first step), then append."""
        if not self.main:
            return
        self.writing = True
        try:
            keep_leading_records(self.path, lambda record: int(record["step"]) <= resume_step)
        except OSError as exc:
            self._stop_writing(exc)

    def start(self, step: int, *, resumed_from: int | None, world_size: int, max_steps: int,
              settings: dict) -> None:
        self._write("start", step, resumed_from=resumed_from, world_size=world_size,
                    max_steps=max_steps, settings=settings)

    def step(self, step: int, *, loss: float, lr: float, skipped: bool,
             compiling: float = 0.0) -> None:
        extra = {"compiling": round(compiling, 3)} if compiling else {}
        self._write("step", step, loss=_finite_or_none(loss), lr=_finite_or_none(lr),
                    skipped=skipped, elapsed=round(time.monotonic() - self._started, 3),
                    **extra)

    def eval(self, step: int, eval_loss: float) -> None:
        self._write("eval", step, eval_loss=_finite_or_none(eval_loss))

    def validation(self, step: int, files: list[Path]) -> None:
        self._write("validation", step, files=[
            Path(path).relative_to(self.output_dir).as_posix() for path in files])

    def checkpoint(self, step: int, folder: Path) -> None:
        self._write("checkpoint", step, folder=Path(folder).name)

    def skip(self, step: int, skipped: dict[str, list[dict]]) -> None:
        """``skipped``: dataset id -> [{path, reason}], as skipped_files.json holds it; the
        line holds the counts and the first few only."""
        listed = sorted(skipped.items())  # each read only as far as the first few
        first = [dict(entry, dataset=dataset) for dataset, entries in listed
                 for entry in entries[:SKIPS_NAMED]][:SKIPS_NAMED]
        self._write("skip", step, count=sum(len(entries) for _, entries in listed),
                    by_dataset={dataset: len(entries) for dataset, entries in listed if entries},
                    first=first, file=SKIPPED_FILES)

    def status(self, step: int, status: str, message: str | None = None) -> None:
        self._write("status", step, status=status,
                    **({"message": message} if message is not None else {}))

    def end(self, step: int, *, status: str, exit_status: int) -> None:
        self._write("end", step, status=status, exit_status=exit_status)

    def _write(self, event_type: str, step: int, **fields) -> None:
        if not self.writing:
            return
        record = {"type": event_type, "step": step, "time": round(time.time(), 3), **fields}
        try:
            line = json.dumps(record, allow_nan=False) + "\n"  # ASCII: a lone surrogate escaped
            with open(self.path, "a", encoding="utf-8") as log:
                log.write(line)
        except (OSError, ValueError) as exc:
            self._stop_writing(exc)

    def _stop_writing(self, exc: Exception) -> None:
        logger.warning("could not write %s: %s; the run goes on without it", self.path, exc)
        self.writing = False
