"""Stop signals (what SLURM and cloud schedulers send before preemption) become a request that
the training loop acts on at the next optimizer-step boundary, where every rank agrees on it.

The handler only records the signal; the loop carries the request in its per-step reduce, writes
a checkpoint and raises ``Preempted``. A further signal while that checkpoint is being written
aborts at once: the save is a staging folder renamed only at its end, so nothing is left that
``latest`` would trust.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

logger = logging.getLogger(__name__)


class PreemptionWatcher:
    """Installs handlers for ``signal_names`` on entry and restores the previous ones on exit.
    ``requested`` is the name of the first signal received, None until one arrives."""

    def __init__(self, signal_names: Sequence[str]):
        self.signals = [signal.Signals[name] for name in dict.fromkeys(signal_names)]
        self.requested: str | None = None
        self._saving = False
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> "PreemptionWatcher":
        for number in self.signals:
            self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

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
