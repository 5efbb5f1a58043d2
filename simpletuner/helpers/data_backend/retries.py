"""Waiting out an outage of remote storage: a request that fails for a reason that passes (the
server is down or restarting, the connection dropped, throttling, a 5xx) is retried with
exponential backoff for a wall-clock window, not a number of attempts.

A fixed number of attempts is spent in a second or two when the server refuses connections
outright, which turned a short restart into hundreds of "unreadable" images. The window is the
storage's setting (``aws_retry_window_seconds``); what still fails when it is spent is raised as
``RetriesSpent`` and becomes one error that stops the run, never a skipped file.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0
STILL_WAITING_EVERY_S = 10.0  # parallel requests share one outage: one warning this often


class RetriesSpent(Exception):
    """``error`` still happened after ``attempts`` tries over ``seconds`` of retrying."""

    def __init__(self, error: Exception, attempts: int, seconds: float):
        super().__init__(f"{error} ({attempts} attempts over {seconds:.1f} s)")
        self.error, self.attempts, self.seconds = error, attempts, seconds


def backoff_delay(attempt: int, left_s: float, jitter: float) -> float:
    """Pure: the pause after failed attempt ``attempt`` (1, 2, ...): 0.5 s doubling up to 10 s,
    scaled by ``jitter`` in [0.5, 1] so parallel requests do not return in one burst, and never
    past the ``left_s`` seconds left of the window."""
    doubled = FIRST_DELAY_S * 2 ** min(attempt - 1, 16)  # bounded: a long window's count
    return min(min(doubled, MAX_DELAY_S) * jitter, max(left_s, 0.0))


class RetryWindow:
    """Retries one storage's requests; ``where`` (its location, no credentials) and ``setting``
    (the option that sets ``seconds``) are named in the warnings. Safe to share by threads: the
    requests of an outage report it together, once, then every STILL_WAITING_EVERY_S."""

    def __init__(self, seconds: float, where: str, setting: str):
        self.seconds, self.where, self.setting = seconds, where, setting
        self._lock = threading.Lock()
        self._outage_since: float | None = None
        self._warned_at = 0.0
        self._jitter = random.Random()  # its own generator: the global one is never advanced

    def run(self, request: Callable[[], T], transient: Callable[[Exception], str | None]) -> T:
        """``request()``'s result; ``transient(error)`` says why an error may pass (None: it
        will not, and it is raised at once)."""
        attempt, first_failure = 0, None
        while True:
            attempt += 1
            try:
                result = request()
            except Exception as error:  # noqa: BLE001 - classified by ``transient``
                reason = transient(error)
                if reason is None:
                    raise
                now = time.monotonic()
                first_failure = first_failure if first_failure is not None else now
                left = self.seconds - (now - first_failure)
                if left <= 0:
                    raise RetriesSpent(error, attempt, now - first_failure) from error
                with self._lock:
                    pause = backoff_delay(attempt, left, 0.5 + self._jitter.random() / 2)
                self._report_waiting(reason, now)
                time.sleep(pause)
                continue
            if first_failure is not None:
                self._report_back()
            return result

    def _report_waiting(self, reason: str, now: float) -> None:
        with self._lock:
            first = self._outage_since is None
            if first:
                self._outage_since = now
            elif now - self._warned_at < STILL_WAITING_EVERY_S:
                return
            self._warned_at = now
            waited = now - self._outage_since
        if first:
            logger.warning("%s: %s; waiting up to %g s for it to answer again, retrying with "
                           "backoff (%s)", self.where, reason, self.seconds, self.setting)
        else:
            logger.warning("%s: %s; still waiting, %.0f s so far of up to %g s (%s)",
                           self.where, reason, waited, self.seconds, self.setting)

    def _report_back(self) -> None:
        with self._lock:
            since, self._outage_since = self._outage_since, None
        if since is not None:
            logger.info("%s answers again after %.1f s; carrying on", self.where,
                           time.monotonic() - since)
