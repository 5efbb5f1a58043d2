"""The output_dir lock for a run of many ranks: the global main process takes it (output_dir_lock.py)
and every rank learns whether it was taken, so every rank stops with the same message."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from accelerate.utils import broadcast_object_list

from simpletuner.configuration import ConfigError
from simpletuner.common.peer_watch import in_collective
from simpletuner.common.together import failing_together
from simpletuner.training.run.output_dir_lock import OutputDirLock


@contextmanager
def output_dir_claimed(output_dir: Path, accelerator, where: str) -> Iterator[None]:
    """The global main process holds the lock for the block. A held lock becomes the same
    ConfigError on every rank (key 'output_dir' of ``where``); an unexpected failure while
    taking it becomes the same RankFailure on every rank."""
    lock = OutputDirLock(output_dir) if accelerator.is_main_process else None
    problem = None
    with failing_together("taking the output_dir lock"):
        if lock is not None:
            problem = lock.try_acquire()
    with in_collective("the output_dir lock's outcome"):
        (problem,) = broadcast_object_list([problem])
    if problem is not None:
        raise ConfigError([f"{where}: key 'output_dir': {problem}"])
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
