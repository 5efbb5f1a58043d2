"""Each epoch's line about the split (what it trims or carries into the next epoch, which
dataset joins or leaves; helpers/multiaspect/sampler.py) goes to ``output_dir/logs/epochs.log``
while a run trains, not to the console, where a long run would print one per epoch. The console
gets one line naming the file. `plan` and the audit keep these lines on the console."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from simpletuner.helpers.multiaspect.sampler import EPOCH_LOGGER

logger = logging.getLogger(__name__)

EPOCHS_LOG = "epochs.log"


@contextmanager
def epoch_lines_to_file(output_dir: str | Path, *, main: bool) -> Iterator[None]:
    """Within the block, the epoch lines go to the log file (appended, so a resumed run's
    follow the first run's). Only the main process says them."""
    if not main:
        yield
        return
    path = Path(output_dir) / "logs" / EPOCHS_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    # backslashreplace: a dataset id or bucket name is never lost to an encoding error
    handler = logging.FileHandler(path, encoding="utf-8", errors="backslashreplace")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    epochs = logging.getLogger(EPOCH_LOGGER)
    epochs.addHandler(handler)
    epochs.propagate = False
    logger.info("each epoch's split (what it trims or carries into the next epoch) is logged "
                "to %s", path)
    try:
        yield
    finally:
        epochs.removeHandler(handler)
        epochs.propagate = True
        handler.close()
