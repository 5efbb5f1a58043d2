"""The end of a failed run on one rank: for an error that is not one of the expected ones (a
bug, say an AttributeError), its full traceback, logged at ERROR on the rank that raised it and
kept in ``output_dir/logs/rank-<k>-error.txt``, which the rank's one-line message names.

The traceback kept is the raising rank's own: failing_together raises the RankFailure there
``from`` the original exception, so the chain holds its stack. A rank that only learned of
another rank's failure has no stack worth keeping (its own ends in a gather): its line names the
failed rank's file instead, which it can tell apart from an expected error by the exception
classes the RankFailure carries.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from simpletuner.common.atomic import atomic_write_text
from simpletuner.common.together import RankFailure

logger = logging.getLogger(__name__)


def error_file(output_dir: str | Path, rank: int) -> Path:
    return Path(output_dir) / "logs" / f"rank-{rank}-error.txt"


def unexpected_ranks(exc: Exception, rank: int, expected: tuple[type, ...]) -> list[int]:
    """The ranks whose error is none of ``expected``: for a RankFailure each failed rank whose
    exception derives from none of them, for any other exception this rank unless it does."""
    if not isinstance(exc, RankFailure):
        return [] if isinstance(exc, expected) else [rank]
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in expected}
    return [failed for failed, _ in exc.failures
            if not names.intersection(exc.error_types.get(failed, ()))]


def report_unexpected(exc: Exception, *, rank: int, output_dir: str | Path,
                      expected: tuple[type, ...]) -> str:
    """Log and keep this rank's traceback when its error is unexpected; returns what the rank's
    one-line message adds: the traceback files of every rank whose error was, or ''. The same
    on every rank for a RankFailure, as its message is."""
    ranks = unexpected_ranks(exc, rank, expected)
    if rank in ranks:
        logger.error("[rank %d] unexpected error", rank, exc_info=exc)
        path = error_file(output_dir, rank)
        try:
            atomic_write_text(path, "".join(traceback.format_exception(exc)))
        except OSError as write_error:  # the stack is in the log above all the same
            logger.warning("could not write the traceback to %s: %s", path, write_error)
    if not ranks:
        return ""
    return "; traceback in " + ", ".join(str(error_file(output_dir, r)) for r in ranks)
