"""Two gloo processes that save a sharded checkpoint and end, repeated: every exit is clean.
Exiting through the interpreter's finalization right after the last collective aborted about
1 run in 4 here ('terminate called without an active exception', see common/clean_exit.py);
twelve clean runs in a row would happen by chance about 1 time in 30 without the fix.

The two processes are started here with the environment torchrun gives its workers, this
process holding the store as torchrun's agent does: a torchrun per run cost an interpreter
and a torch import more than the exit under test needs."""

from __future__ import annotations

import sys
import tempfile
import unittest
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from launching import Launch
from training_fixtures import environment

RUNNER = Path(__file__).with_name("fsdp_exit_runner.py")
RUNS, WORLD = 12, 2


def worker_environment(tmp: str, store: TCPStore, rank: int) -> dict[str, str]:
    """What torchrun --standalone sets for worker ``rank`` of a run whose agent holds ``store``."""
    return {**environment(tmp), "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD), "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def run_pair(tmp: str, out: Path) -> list[tuple[int, str]]:
    """Each worker's exit status and stderr."""
    store = TCPStore("127.0.0.1", 0, WORLD, is_master=True, timeout=timedelta(seconds=120),
                     wait_for_workers=False)
    workers = [Launch([sys.executable, RUNNER, out], tmpdir=tmp,
                      env=worker_environment(tmp, store, rank)) for rank in range(WORLD)]
    try:
        statuses = [worker.wait(timeout=120) for worker in workers]
    finally:
        for worker in workers:
            worker.close()
    return [(status, worker.stderr()) for status, worker in zip(statuses, workers)]


class CleanExitTest(unittest.TestCase):
    def test_repeated_sharded_saves_always_exit_cleanly(self):
        with tempfile.TemporaryDirectory(prefix="st-fsdp-exit-") as tmp:
            for run in range(RUNS):
                out = Path(tmp) / f"run-{run}"
                for rank, (status, stderr) in enumerate(run_pair(tmp, out)):
                    self.assertNotIn("terminate called", stderr, f"run {run}, rank {rank}")
                    self.assertEqual(status, 0, f"run {run}, rank {rank}: {stderr[-3000:]}")
                self.assertEqual(len(list((out / "checkpoint-1").glob("shard-*"))), 2)


if __name__ == "__main__":
    unittest.main()
