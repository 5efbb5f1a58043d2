"""Fail together: a failure that one rank sees becomes the same error on every rank before
anyone enters the next collective, so no rank is left waiting alone.

Wrap a step that runs on some ranks only, or that can fail on one rank, in ``failing_together``.
Every rank must enter the block (a rank with nothing to do runs an empty one): on the way out
the ranks exchange their outcomes in one gather, and if any failed, all raise ``RankFailure``
naming each failed rank and its error. The gather is also a barrier: when the block is left,
every rank has finished it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from accelerate.utils import gather_object

logger = logging.getLogger(__name__)


class RankFailure(RuntimeError):
    """Raised on every rank, with the same message, when a step failed on one rank or more."""

    def __init__(self, what: str, failures: Sequence[tuple[int, str]]):
        self.what = what
        self.failures = list(failures)
        super().__init__(describe_failures(what, self.failures))


def describe_failures(what: str, failures: Sequence[tuple[int, str]]) -> str:
    """One line; an error seen alike by several ranks is named once, with those ranks."""
    texts = {text for _, text in failures}
    if len(texts) == 1:
        ranks = [rank for rank, _ in failures]
        label = "rank" if len(ranks) == 1 else "ranks"
        return f"{what} failed on {label} {', '.join(map(str, ranks))}: {texts.pop()}"
    details = "; ".join(f"rank {rank}: {text}" for rank, text in failures)
    return f"{what} failed on {len(failures)} ranks: {details}"


def describe_error(exc: BaseException) -> str:
    """One line: the exception's type and message (OSError: with the file it names)."""
    if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in str(exc):
        return f"{type(exc).__name__}: {exc} ({exc.filename})"
    return f"{type(exc).__name__}: {exc}"


def raise_if_any_failed(what: str, error: str | None) -> None:
    """The collective: every rank calls it with its own error text (None when it succeeded)."""
    gathered = gather_object([error])
    failures = [(rank, text) for rank, text in enumerate(gathered) if text is not None]
    if failures:
        raise RankFailure(what, failures)


@contextmanager
def failing_together(what: str) -> Iterator[None]:
    """Run the block; then agree with every rank on whether it failed anywhere (see module doc).
    ``what`` names the step in the error, e.g. "validation at step 500". A RankFailure from a
    block nested inside was raised on every rank at once, so it passes through unchanged.
    KeyboardInterrupt and other BaseExceptions are not caught: they end the process, and its
    peers with it."""
    try:
        yield
    except RankFailure:
        raise
    except Exception as exc:
        logger.debug("%s failed on this rank", what, exc_info=True)
        try:
            raise_if_any_failed(what, describe_error(exc))
        except RankFailure as agreed:
            raise agreed from exc
    raise_if_any_failed(what, None)
