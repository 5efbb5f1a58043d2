"""How a training run ends, as an exit status a scheduler can act on (README: "Exit status")."""

from __future__ import annotations

import os
from pathlib import Path

from simpletuner.common.atomic import atomic_write_text
from simpletuner.configuration.errors import ConfigError
from simpletuner.helpers.metadata.split import UndersizedBucketsError

EXIT_TRAINED = 0
EXIT_FAILED = 1      # anything else; the message says what and where
EXIT_CONFIG = 2      # a configuration problem, reported before any heavy work
EXIT_DIVERGED = 3    # loss or gradient norm non-finite for max_nonfinite_steps steps in a row
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on a signal after a checkpoint; resume with 'latest'

# accelerate launch turns every non-zero status of a training process into 1, so ./train.sh
# names a folder here and each training process leaves its own status there.
EXIT_STATUS_DIR_ENV = "SIMPLETUNER_EXIT_STATUS_DIR"


def record_exit_status(status: int) -> int:
    """Leave ``status`` for ./train.sh when it launched this process; returns ``status``."""
    folder = os.environ.get(EXIT_STATUS_DIR_ENV)
    if folder:
        atomic_write_text(Path(folder) / f"{os.getpid()}.status", f"{status}\n")
    return status


def exit_status_for(exc: Exception) -> int:
    # A bucket too small for the effective batch cannot start as configured, like a config
    # problem: it is known before any step, and the report lists the settings that fix it.
    if isinstance(exc, (ConfigError, UndersizedBucketsError)):
        return EXIT_CONFIG
    if isinstance(exc, Preempted):
        return EXIT_PREEMPTED
    if isinstance(exc, Diverged):
        return EXIT_DIVERGED
    return EXIT_FAILED


class Preempted(Exception):
    """A stop signal arrived; every rank agreed on it at a step boundary and a checkpoint was
    written (``checkpoint`` is None when the signal came before the first step)."""

    def __init__(self, signal_name: str, step: int, checkpoint):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        where = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint needed"
        super().__init__(f"preempted by {signal_name} at step {step} ({where}); resumable: "
                         "run again with resume_from_checkpoint 'latest'")


class Diverged(Exception):
    """Too many non-finite steps in a row; nothing non-finite was saved."""
