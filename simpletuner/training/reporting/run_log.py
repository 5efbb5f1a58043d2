"""What the run report needs that no other file holds, written by the main rank: the event
log ``events.jsonl`` (events.py: the start, every step's loss and LR, the evaluations,
validations, checkpoints, skipped files, status changes and the end), cut back to the resume
step, so a resumed run continues the same curves; ``training_status.json`` (running, finished,
preempted, diverged or failed, with the message, the settings that matter and the buckets), a
snapshot rewritten atomically; and, with ``trace_samples``, ``trace/plan.json`` (what the
exactly-once check compares the traces with).

The report page is rendered from these and the run's other files at every validation, every
checkpoint and at the end (also after a failure). The report is for people: a failure to write
it is logged as a warning and never stops the training.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from simpletuner.common.atomic import atomic_write_json
from simpletuner.training.reporting.events import EventLog
from simpletuner.training.run.outcomes import (EXIT_DIVERGED, EXIT_PREEMPTED, Diverged,
                                               Preempted, exit_status_for)
from simpletuner.training.run.preemption import StopRequested

logger = logging.getLogger(__name__)

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
    return {"status": "failed", "exit_status": exit_status_for(exc),
            "message": f"{type(exc).__name__}: {exc}"}


def shown_settings(training, processes: int) -> dict:
    settings = {name: getattr(training, name) for name in SHOWN_OPTIONS
                if getattr(training, name, None) is not None}
    if training.model_type != "lora":
        settings.pop("lora_rank", None)
    settings["processes"] = processes
    return settings


class RunLog:
    """The main rank's writer; on other ranks, and until the preflight accepted output_dir,
    every method writes nothing (a refused output_dir may be a dataset's folder). ``events``:
    the event log, for the trainer's own events (evaluations, validations, checkpoints)."""

    def __init__(self, output_dir: Path, *, main: bool, render):
        """``render(output_dir, check_trace=...)`` writes the report page from what is on
        disk; the trace's exactly-once check is made at the end only."""
        self.output_dir, self.main, self._render = Path(output_dir), main, render
        self.writing = False
        self.events = EventLog(self.output_dir, main=main)
        self.resumed_from: int | None = None
        self.status: dict = {"status": "starting", "started_at": time.time()}

    def output_dir_accepted(self, resumed_from: int | None = None) -> None:
        """``resumed_from``: the step of the checkpoint the run resumes from; the event log
        keeps the lines up to it (an earlier attempt's), none of a step after it."""
        self.writing, self.resumed_from = self.main, resumed_from
        self.status["step"] = resumed_from or 0
        self.events.open(resumed_from or 0)

    def start(self, *, total_steps: int, settings: dict, buckets: dict[str, dict[str, int]],
              effective_batch: int, world_size: int) -> None:
        """Called once the run knows its length, before its first step."""
        step = self.resumed_from or 0
        self.status.update(status="running", resume_step=step, step=step,
                           total_steps=total_steps, settings=settings, buckets=buckets,
                           effective_batch=effective_batch)
        self.events.start(step, resumed_from=self.resumed_from, world_size=world_size,
                          max_steps=total_steps, settings=settings)
        self.events.status(step, "running")
        self.render()

    def write_plan(self, trace_folder: Path, make_plan) -> None:
        """``make_plan()``: the plan, computed on the main rank only."""
        self._guarded(lambda: atomic_write_json(trace_folder / PLAN_FILE, make_plan(), indent=1))

    def log_step(self, step: int, loss: float, lr: float, skipped: bool,
                 compiling: float = 0.0) -> None:
        """``compiling``: the seconds of the step torch.compile took (dynamo_backend)."""
        self.status["step"] = step
        self.events.step(step, loss=loss, lr=lr, skipped=skipped, compiling=compiling)

    def render(self, *, final: bool = False) -> None:
        """The status as it stands and the page; a failure is a warning, not the run's end."""
        self._guarded(self._write_status,
                      lambda: self._render(self.output_dir, check_trace=final))

    def finish(self) -> None:
        self.status.update(status="finished", exit_status=0)
        self.events.end(self.status["step"], status="finished", exit_status=0)
        self.render(final=True)

    def end_with(self, exc: BaseException) -> None:
        ending = ending_of(exc)
        self.status.update(ending)
        step = self.status.get("step", 0)
        self.events.status(step, ending["status"], ending["message"])
        self.events.end(step, status=ending["status"], exit_status=ending["exit_status"])
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
