"""What the run report needs that no other file holds, written by the main rank:
``training_steps.jsonl`` (one line per step: loss, LR, whether it was skipped as non-finite,
when), cut back to the resume step like the other logs, so a resumed run continues the same
curves; ``training_status.json`` (running, finished, preempted, diverged or failed, with the
message, the settings that matter and the buckets), rewritten atomically; and, with
``trace_samples``, ``trace/plan.json`` (what the exactly-once check compares the traces with).

The report page is rendered from these and the run's other files at every validation, every
checkpoint and at the end (also after a failure). The report is for people: a failure to write
it is logged as a warning and never stops the training.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from simpletuner.common.atomic import atomic_write_json
from simpletuner.common.jsonl_log import keep_leading_records
from simpletuner.training.run.outcomes import EXIT_DIVERGED, EXIT_PREEMPTED, Diverged, Preempted
from simpletuner.training.run.preemption import StopRequested

logger = logging.getLogger(__name__)

STEP_LOG = "training_steps.jsonl"
EVAL_LOG = "eval_loss.jsonl"  # written by evaluation.py (which needs torch; the report does not)
STATUS_FILE = "training_status.json"
PLAN_FILE = "plan.json"  # in the trace folder, beside the rank traces

# The options a reader of the report wants first; the rest are in config.json.
SHOWN_OPTIONS = ("model_family", "model_type", "pretrained_model_name_or_path", "lora_rank",
                 "optimizer", "learning_rate", "lr_scheduler", "lr_warmup_steps",
                 "train_batch_size", "gradient_accumulation_steps", "max_train_steps",
                 "num_train_epochs", "resolution", "mixed_precision", "max_grad_norm",
                 "use_ema", "seed", "validation_steps", "checkpointing_steps",
                 "eval_steps_interval", "trace_samples")


def ending_of(exc: BaseException) -> dict:
    """The status fields of a run that ended with ``exc``."""
    if isinstance(exc, (Preempted, StopRequested)):
        return {"status": "preempted", "exit_status": EXIT_PREEMPTED, "message": str(exc)}
    if isinstance(exc, Diverged):
        return {"status": "diverged", "exit_status": EXIT_DIVERGED, "message": str(exc)}
    return {"status": "failed", "message": f"{type(exc).__name__}: {exc}"}


def shown_settings(training, processes: int) -> dict:
    settings = {name: getattr(training, name) for name in SHOWN_OPTIONS
                if getattr(training, name, None) is not None}
    if training.model_type != "lora":
        settings.pop("lora_rank", None)
    settings["processes"] = processes
    return settings


class RunLog:
    """The main rank's writer; on other ranks, and until the preflight accepted output_dir,
    every method writes nothing (a refused output_dir may be a dataset's folder)."""

    def __init__(self, output_dir: Path, *, main: bool, render):
        """``render(output_dir, check_trace=...)`` writes the report page from what is on
        disk; the trace's exactly-once check is made at the end only."""
        self.output_dir, self.main, self._render = Path(output_dir), main, render
        self.writing = False
        self.status: dict = {"status": "starting", "started_at": time.time()}

    def output_dir_accepted(self) -> None:
        self.writing = self.main

    def start(self, *, resume_step: int, total_steps: int, settings: dict,
              buckets: dict[str, dict[str, int]], effective_batch: int) -> None:
        """Called once the run knows where it starts: the step log keeps the steps up to
        ``resume_step`` (none for a fresh run, whatever an earlier one left)."""
        self.status.update(status="running", resume_step=resume_step, step=resume_step,
                           total_steps=total_steps, settings=settings, buckets=buckets,
                           effective_batch=effective_batch)
        self._guarded(lambda: keep_leading_records(
            self.output_dir / STEP_LOG, lambda record: int(record["step"]) <= resume_step))
        self.render()

    def write_plan(self, trace_folder: Path, make_plan) -> None:
        """``make_plan()``: the plan, computed on the main rank only."""
        self._guarded(lambda: atomic_write_json(trace_folder / PLAN_FILE, make_plan(), indent=1))

    def log_step(self, step: int, loss: float, lr: float, skipped: bool) -> None:
        """Appended and flushed per step (a line is a few dozen bytes); NaN is not JSON, so a
        non-finite loss is null."""
        record = {"step": step, "loss": loss if math.isfinite(loss) else None, "lr": lr,
                  "skipped": skipped, "time": round(time.time(), 3)}
        self.status["step"] = step
        self._guarded(lambda: self._append(record))

    def _append(self, record: dict) -> None:
        with open(self.output_dir / STEP_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(record, allow_nan=False) + "\n")

    def render(self, *, final: bool = False) -> None:
        """The status as it stands and the page; a failure is a warning, not the run's end."""
        self._guarded(self._write_status,
                      lambda: self._render(self.output_dir, check_trace=final))

    def finish(self) -> None:
        self.status.update(status="finished", exit_status=0)
        self.render(final=True)

    def end_with(self, exc: BaseException) -> None:
        self.status.update(ending_of(exc))
        self.render(final=True)

    def _guarded(self, *actions) -> None:
        """Main rank only, once writing; a failure is a warning: the report never stops a run
        (nor makes the main rank late for a collective)."""
        if not self.writing:
            return
        try:
            for action in actions:
                action()
        except Exception as exc:
            logger.warning("could not write the run report in %s: %s", self.output_dir, exc)

    def _write_status(self) -> None:
        self.status["updated_at"] = time.time()
        atomic_write_json(self.output_dir / STATUS_FILE, self.status, indent=1)
