"""Fail together: a failure that one rank sees becomes the same error on every rank before
anyone enters the next collective, so no rank is left waiting alone.

Wrap a step that runs on some ranks only, or that can fail on one rank, in ``failing_together``.
Every rank must enter the block (a rank with nothing to do runs an empty one): on the way out
the ranks exchange their outcomes in one gather, and if any failed, all raise ``RankFailure``
naming each failed rank and its error. The gather is also a barrier: when the block is left,
every rank has finished it. A rank that failed raises the RankFailure ``from`` its own exception,
so that traceback stays in the chain; every rank learns each failed rank's exception classes
(``error_types``), so a rank that did not fail can tell an expected error from a bug.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from accelerate.utils import gather_object

from simpletuner.common.peer_watch import in_collective

logger = logging.getLogger(__name__)


class RankFailure(RuntimeError):
    """Raised on every rank, with the same message, when a step failed on one rank or more."""

    def __init__(self, what: str, failures: Sequence[tuple[int, str]],
                 error_types: Mapping[int, Sequence[str]] | None = None):
        self.what = what
        self.failures = list(failures)
        # rank -> qualified names of the classes of its exception (class_names), most derived first
        self.error_types = {rank: tuple(names) for rank, names in (error_types or {}).items()}
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


def class_names(exc: BaseException) -> tuple[str, ...]:
    """``module.QualName`` of the exception's class and of every class it derives from."""
    return tuple(f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__)


def raise_if_any_failed(what: str, error: BaseException | None) -> None:
    """The collective: every rank calls it with its own exception (None when it succeeded)."""
    outcome = None if error is None else (describe_error(error), class_names(error))
    with in_collective(f"the end of {what}"):
        gathered = gather_object([outcome])
    failed = [(rank, got) for rank, got in enumerate(gathered) if got is not None]
    if failed:
        raise RankFailure(what, [(rank, text) for rank, (text, _) in failed],
                          {rank: types for rank, (_, types) in failed})


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
        # Every error's stack, expected ones too, at log_level DEBUG; train.py logs a bug's at ERROR.
        logger.debug("%s failed on this rank", what, exc_info=True)
        try:
            raise_if_any_failed(what, exc)
        except RankFailure as agreed:
            raise agreed from exc
    raise_if_any_failed(what, None)
