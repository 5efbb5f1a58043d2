"""A rank that freezes (a real SIGSTOP) during training or start-up: the other rank stops after
the collective timeout, naming the frozen rank and where each of them was, instead of waiting
forever; and a SIGTERM sent while it waits for the frozen rank is honoured at once."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest
from pathlib import Path

from simpletuner.common.peer_watch import TIMEOUT_ENV
from simpletuner.training.run.outcomes import EXIT_FAILED
from launching import Launch
from test_fail_together import LAUNCHER
from test_preemption import train_command, worker_pid
from training_fixtures import environment, make_shapes, write_config

TIMEOUT = 240
STUCK = re.compile(r"\[rank 0\] training stopped \(exit status 1\): (.+)$", re.M)


class FrozenRankTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-frozen-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))

    def start_and_freeze_rank_1(self, name: str, timeout: float) -> tuple[Launch, int, int]:
        config = write_config(self.root, self.root / "data", name, num_processes=2,
                              train_batch_size=1, max_train_steps=100000,
                              trace_samples=True)
        env = environment(self.tmp)
        env.update({"ACCELERATE_USE_CPU": "true", TIMEOUT_ENV: str(timeout)})
        run = Launch(train_command(config, 2), tmpdir=self.tmp, env=env)
        self.addCleanup(run.close)
        trace = self.root / f"{name}-out" / "trace" / "rank-1.jsonl"
        deadline = time.monotonic() + TIMEOUT
        while not (trace.is_file() and len(trace.read_text().splitlines()) >= 3):
            self.assertIsNone(run.process.poll(), run.stderr()[-3000:])
            self.assertLess(time.monotonic(), deadline, "training did not start")
            time.sleep(0.1)
        rank_0, rank_1 = worker_pid(run, 0), worker_pid(run, 1)
        os.kill(rank_1, signal.SIGSTOP)
        self.addCleanup(self.kill_quietly, rank_1)
        return run, rank_0, rank_1

    @staticmethod
    def kill_quietly(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait_for_rank_0(self, run: Launch, rank_0: int, within: float) -> str:
        """Rank 0's line once it has ended, which must be within ``within`` seconds."""
        started = time.monotonic()
        while Path(f"/proc/{rank_0}").exists() and not _zombie(rank_0):
            self.assertLess(time.monotonic() - started, within, run.stderr()[-3000:])
            time.sleep(0.2)
        found = STUCK.search(run.stderr())
        self.assertIsNotNone(found, run.stderr()[-3000:])
        return found.group(1)

    def test_the_waiting_rank_stops_after_the_timeout_naming_the_frozen_one(self):
        # 20 s: long enough that a rank slowed by a loaded machine before the freeze is not
        # mistaken for a frozen one (8 s was, with three suites on two cores).
        run, rank_0, rank_1 = self.start_and_freeze_rank_1("timeout", timeout=20)
        started = time.monotonic()
        line = self.wait_for_rank_0(run, rank_0, within=75)
        self.assertGreaterEqual(time.monotonic() - started, 19)  # not before the timeout
        self.assertRegex(line, rf"^waited \d+ s \({TIMEOUT_ENV} 20\) in 'step \d+: [^']+' for "
                               r"rank 1 \(last at 'step \d+: [^']+'(, no sign of life)?\)$")
        self.kill_quietly(rank_1)  # else the launcher gives it 30 s to answer its SIGTERM
        with run:
            self.assertEqual(run.wait(TIMEOUT), EXIT_FAILED, run.stderr()[-3000:])

    def test_sigterm_while_waiting_for_a_frozen_rank_stops_at_once(self):
        run, rank_0, _ = self.start_and_freeze_rank_1("sigterm", timeout=3600)
        time.sleep(12)  # past the heartbeat's silence limit: rank 1 shows no sign of life
        os.kill(rank_0, signal.SIGTERM)
        line = self.wait_for_rank_0(run, rank_0, within=30)
        self.assertRegex(line, r"^stopped by SIGTERM after waiting \d+ s in 'step \d+: [^']+' "
                               r"for rank 1 \(last at 'step \d+: [^']+', no sign of life\)$")


    def test_a_rank_frozen_in_start_up_is_named_at_the_collective_it_never_reached(self):
        """Rank 1 stops as it has read the bucket index (rank 0 never does: it wrote it), so
        rank 0 waits for it in the index agreement."""
        config = write_config(self.root, self.root / "data", "start-up", num_processes=2,
                              train_batch_size=1, max_train_steps=2)
        (self.root / "status").mkdir()
        env = environment(self.tmp)
        env.update({"ACCELERATE_USE_CPU": "true", TIMEOUT_ENV: "8"})
        run = Launch([sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc_per_node", "2", str(LAUNCHER), str(self.root / "status"),
                      "--fault", "simpletuner.helpers.metadata.backends.base:"
                      "MetadataBackend.load_index", "--on-rank", "1", "--frozen-after", "1",
                      "train", "--config", str(config)], tmpdir=self.tmp, env=env)
        self.addCleanup(run.close)
        deadline = time.monotonic() + TIMEOUT
        while (worker_pid(run, 0) is None or worker_pid(run, 1) is None
               or _state(worker_pid(run, 1)) != "T"):
            self.assertIsNone(run.process.poll(), run.stderr()[-3000:])
            self.assertLess(time.monotonic(), deadline, "rank 1 did not freeze")
            time.sleep(0.1)
        rank_0, rank_1 = worker_pid(run, 0), worker_pid(run, 1)
        self.addCleanup(self.kill_quietly, rank_1)
        line = self.wait_for_rank_0(run, rank_0, within=60)
        self.assertRegex(line, rf"^waited \d+ s \({TIMEOUT_ENV} 8\) in 'the bucket index "
                               r"agreement' for rank 1 \(last at 'discovery's outcome from the "
                               r"main process'(, no sign of life)?\)$")
        self.kill_quietly(rank_1)
        with run:
            self.assertNotEqual(run.wait(TIMEOUT), 0, run.stderr()[-3000:])


def _state(pid: int) -> str:
    """The process's state letter (R, S, T for stopped, Z...), or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1]
    except (OSError, IndexError):
        return ""


def _zombie(pid: int) -> bool:
    return _state(pid) == "Z"


if __name__ == "__main__":
    unittest.main()
