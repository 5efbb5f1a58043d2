"""Stop signals (what SLURM and cloud schedulers send before preemption), honoured from the
entry point's start to its end.

In the training loop the handler only records the signal; the loop carries the request in its
per-step reduce, writes a checkpoint and raises ``Preempted``. A further signal while that
checkpoint is being written aborts at once: the save is a staging folder renamed only at its
end, so nothing is left that ``latest`` would trust. Before the first step (``stopping_at_once``:
discovery, caching, loading) there is nothing to checkpoint, and waiting for a step could take
hours: the signal raises ``StopRequested`` where the run is. Every write there is atomic, so
what was cached is kept and what was half written is removed. During the export the signal is
recorded and the export finished.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

logger = logging.getLogger(__name__)


class StopRequested(BaseException):
    """A stop signal before the first step. A BaseException, so that no ``except Exception``
    of discovery or caching mistakes it for a bad file or a failed read."""

    def __init__(self, signal_name: str):
        self.signal_name = signal_name
        super().__init__(f"stopped by {signal_name} before the first step; what was cached is "
                         "kept: run again to continue")


class PreemptionWatcher:
    """Installs handlers for ``signal_names`` on entry and restores the previous ones on exit.
    ``requested`` is the name of the first signal received, None until one arrives."""

    def __init__(self, signal_names: Sequence[str]):
        self.signals = [signal.Signals[name] for name in dict.fromkeys(signal_names)]
        self.requested: str | None = None
        self._saving = False
        self._at_once = False
        self._finishing: str | None = None
        self._depth = 0    # entered by the entry point and again by the trainer: installed once
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> "PreemptionWatcher":
        if self._depth == 0:
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._on_signal)
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._restore()

    @contextmanager
    def stopping_at_once(self) -> Iterator[None]:
        """Within the block (before the first step), a signal raises StopRequested; one that
        arrived before the block is raised on entry."""
        if self.requested is not None:
            raise StopRequested(self.requested)
        self._at_once = True
        try:
            yield
        finally:
            self._at_once = False

    @contextmanager
    def finishing(self, what: str) -> Iterator[None]:
        """Within the block (the export), a signal is recorded and ``what`` completed."""
        self._finishing = what
        try:
            yield
        finally:
            self._finishing = None

    @contextmanager
    def aborting_on_signal(self) -> Iterator[None]:
        """Within the block (the preemption checkpoint), a signal aborts instead of waiting."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def _restore(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()

    def _on_signal(self, number: int, frame: object) -> None:
        name = signal.Signals(number).name
        if self._at_once:
            self.requested, self._at_once = name, False  # a second signal only records
            logger.warning("%s received before the first step: stopping now", name)
            raise StopRequested(name)
        if self._finishing is not None:
            self.requested = self.requested or name
            logger.warning("%s received during %s: finishing it, then stopping", name,
                           self._finishing)
            return
        if self._saving:
            # Default handling from here on, so a third signal ends the process outright.
            self._restore()
            raise KeyboardInterrupt(f"{name} during the preemption checkpoint: aborted the save")
        if self.requested is not None:
            logger.warning("%s received; already stopping at the next step boundary", name)
            return
        self.requested = name
        logger.warning("%s received: stopping at the next optimizer step with a checkpoint "
                       "(a signal during that save aborts it)", name)
