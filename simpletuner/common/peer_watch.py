"""A rank that never arrives: the ranks waiting for it stop, naming it, instead of waiting alone.

Each of the run's collectives runs inside ``in_collective(what)``, which says in the process
group's store that this rank entered ``what`` (a count and the name) and, after it, left it. A
watcher thread on every rank reads every rank's counts each second and beats a heartbeat. When
this rank has been inside a collective for ``timeout`` seconds (SimpleTuner's
``SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS``; the process group's own timeout is set longer, so
this message comes first), ``on_stuck`` gets a message naming the ranks it waits for: those that
have not entered it, and those that show no sign of life (no heartbeat: a SIGSTOPped process, a
hung host), which may have stopped inside it.

A stop signal cannot run its Python handler while the main thread is blocked in a collective.
The watcher sees it through the signal wake-up file descriptor instead: if this rank is then
waiting for a rank without a sign of life, ``on_stuck`` is called at once. A peer that is alive
and busy (the main rank validating or exporting) is waited for as usual, so the signal is then
honoured at the next step, with a checkpoint.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch.distributed as dist

TIMEOUT_ENV = "SIMPLETUNER_PROCESS_GROUP_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT = 5400.0  # SimpleTuner's default
LIFELESS_AFTER = 10.0     # seconds without a heartbeat: the process is stopped or its host hung
_ENTERED, _LEFT = "simpletuner/entered/{}", "simpletuner/left/{}"
_PLACE, _BEAT = "simpletuner/at/{}", "simpletuner/alive/{}"
_STOPPED = "simpletuner/stopped/{}"


def collective_timeout(environ=os.environ) -> float:
    """Seconds a rank waits for another in a collective; ValueError names a bad value."""
    raw = environ.get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"{TIMEOUT_ENV} is {raw!r}; set it to a number of seconds above 0")
    return value


def _store():
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.distributed_c10d._get_default_store()


@contextmanager
def in_collective(what: str) -> Iterator[None]:
    """Around one of the run's collectives, named ``what`` (a no-op without peers)."""
    store = _store()
    if store is None:
        yield
        return
    rank = dist.get_rank()
    store.set(_PLACE.format(rank), what)
    store.add(_ENTERED.format(rank), 1)
    try:
        yield
    finally:
        store.add(_LEFT.format(rank), 1)


def record_stop(signal_name: str) -> None:
    """Tell the other ranks that this one stops on ``signal_name``. Before the first step a
    signal that reaches one rank stops it at once; the others then see only a broken collective
    and read why here (``stopped_peers``)."""
    store = _store()
    if store is not None:
        store.set(_STOPPED.format(dist.get_rank()), signal_name)


def stopped_peers() -> dict[int, str]:
    """The other ranks that recorded a stop, with its signal ({} without peers)."""
    store = _store()
    if store is None:
        return {}
    found = {}
    try:
        for rank in range(dist.get_world_size()):
            key = _STOPPED.format(rank)
            if rank != dist.get_rank() and store.check([key]):
                found[rank] = store.get(key).decode()
    except (RuntimeError, OSError):  # the store is gone with its host: report what was read
        pass
    return found


class PeerWatch:
    """The watcher thread of one rank, for the ``with`` block of the run."""

    def __init__(self, timeout: float, stop_signals: Iterable[signal.Signals],
                 on_stuck: Callable[[str], None]):
        self.timeout, self.on_stuck = timeout, on_stuck
        self.signals = {int(number) for number in stop_signals}
        self.store = _store()
        if self.store is not None:
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._done = threading.Event()
        self._wakeup: tuple[int, int] | None = None
        self._previous_wakeup = -1
        self._signal_name: str | None = None

    def __enter__(self) -> "PeerWatch":
        if self.store is None:
            return self
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        self._wakeup = (read_end, write_end)
        self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="peer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._wakeup is None:
            return
        self._done.set()
        self._thread.join()
        signal.set_wakeup_fd(self._previous_wakeup)
        for fd in self._wakeup:
            os.close(fd)

    def _watch(self) -> None:
        entered, beats = _Progress(self.world), _Progress(self.world)
        while not self._done.is_set():
            self._read_signals(timeout=1.0)
            self.store.add(_BEAT.format(self.rank), 1)
            left = self.store.add(_LEFT.format(self.rank), 0)  # read first: never ahead
            now = time.monotonic()
            entered.update(self._values(_ENTERED), now)
            beats.update(self._values(_BEAT), now)
            if left == entered.values[self.rank]:
                continue  # not inside a collective
            waited = now - entered.changed[self.rank]
            lifeless = [r for r in range(self.world)
                        if r != self.rank and now - beats.changed[r] >= LIFELESS_AFTER]
            if waited >= self.timeout or (self._signal_name and lifeless):
                behind = entered.behind(self.rank)
                self.on_stuck(self._describe(sorted({*behind, *lifeless}) or
                                             [r for r in range(self.world) if r != self.rank],
                                             lifeless, waited))
                return

    def _read_signals(self, timeout: float) -> None:
        read_end = self._wakeup[0]
        ready, _, _ = select.select([read_end], [], [], timeout)
        if ready:
            for number in os.read(read_end, 64):
                if number in self.signals and self._signal_name is None:
                    self._signal_name = signal.Signals(number).name

    def _values(self, key: str) -> list[int]:
        return [self.store.add(key.format(rank), 0) for rank in range(self.world)]

    def _place(self, rank: int) -> str:
        key = _PLACE.format(rank)
        return self.store.get(key).decode() if self.store.check([key]) else "the start"

    def _describe(self, waiting_for: list[int], lifeless: list[int], waited: float) -> str:
        here = self.store.get(_PLACE.format(self.rank)).decode()
        missing = "; ".join(f"rank {r} (last at '{self._place(r)}'"
                            + (", no sign of life" if r in lifeless else "") + ")"
                            for r in waiting_for)
        if self._signal_name and lifeless and waited < self.timeout:
            cause = f"stopped by {self._signal_name} after waiting {waited:.0f} s"
        else:
            cause = f"waited {waited:.0f} s ({TIMEOUT_ENV} {self.timeout:g})"
        return f"{cause} in '{here}' for {missing}"


class _Progress:
    """Per rank: the last value read and when it last changed (this host's clock)."""

    def __init__(self, world: int):
        self.values = [-1] * world
        self.changed = [0.0] * world

    def update(self, values: list[int], now: float) -> None:
        for rank, value in enumerate(values):
            if value != self.values[rank]:
                self.values[rank], self.changed[rank] = value, now

    def behind(self, rank: int) -> list[int]:
        return [other for other, value in enumerate(self.values) if value < self.values[rank]]
