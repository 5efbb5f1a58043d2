"""Preemption: a stop signal sent to a real training process at a random step becomes a
checkpoint at the next step boundary and exit status 75; resuming with 'latest' ends exactly as
the uninterrupted run (weights and sample trace). With two processes the signal goes to one
rank only, and the agreement makes both stop at the same step."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

from safetensors.torch import load_file

from simpletuner.training.run.preemption import PreemptionWatcher
from training_fixtures import REPO, environment, make_shapes, read_jsonl, write_config

TIMEOUT = 240
PREEMPTED = re.compile(
    r"\[rank (\d)\] training stopped \(exit status 75\): preempted by (.+?) at step (\d+)")


def train_command(config: Path, processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "simpletuner.train", "--config", str(config)]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
            str(processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", "0",
            "-m", "simpletuner.train", "--config", str(config)]


def start(config: Path, processes: int, tmpdir: str, log: Path) -> subprocess.Popen:
    env = environment(tmpdir)
    env["ACCELERATE_USE_CPU"] = "true"
    with open(log, "w") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(train_command(config, processes), cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)


def finish(process: subprocess.Popen, log: Path) -> tuple[int, str]:
    try:
        code = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and every worker it started
        process.wait()
        raise
    return code, log.read_text()


def worker_pid(launcher: int, rank: int) -> int | None:
    """The descendant of ``launcher`` that accelerate started as ``rank``."""
    pending = [launcher]
    while pending:
        pid = pending.pop()
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        if pid != launcher and f"RANK={rank}".encode() in environ:
            return pid
        pending += [int(child) for child in children]
    return None


def signal_at_line(process: subprocess.Popen, trace: Path, line: int, target: int) -> None:
    """Send SIGTERM to ``target`` once ``trace`` shows ``line`` micro-batches."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        if trace.is_file() and len(trace.read_text().splitlines()) >= line:
            os.kill(target, signal.SIGTERM)
            return
        time.sleep(0.02)
    raise AssertionError(f"the run ended or stalled before micro-batch {line}")


def unet(folder: Path) -> dict:
    return load_file(str(folder / "pipeline" / "unet" / "diffusion_pytorch_model.safetensors"))


class PreemptedRun:
    """Mixed into a TestCase: an uninterrupted run alongside one signalled at a random
    micro-batch, then the signalled run resumed in its own output folder with 'latest'."""

    processes: int
    signalled_rank: int
    options: dict

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-preempt-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        lines = cls.options["max_train_steps"] * cls.options["gradient_accumulation_steps"]
        cls.line = random.randrange(2, lines // 2)
        common = dict(cls.options, num_processes=cls.processes, trace_samples=True)
        cls.full_out, cls.out = root / "full-out", root / "stopped-out"
        full = start(write_config(root, root / "data", "full", **common), cls.processes, cls.tmp,
                     root / "full.log")
        stopped = start(write_config(root, root / "data", "stopped", **common), cls.processes,
                        cls.tmp, root / "stopped.log")
        target = stopped.pid if cls.processes == 1 else None
        try:
            while target is None and stopped.poll() is None:
                target = worker_pid(stopped.pid, cls.signalled_rank)
                time.sleep(0.05)
            if target is None:
                raise AssertionError(f"no worker of rank {cls.signalled_rank} was found")
            signal_at_line(stopped, cls.out / "trace" / f"rank-{cls.signalled_rank}.jsonl",
                           cls.line, target)
        finally:
            cls.stopped = finish(stopped, root / "stopped.log")
            cls.full = finish(full, root / "full.log")
        again = write_config(root, root / "data", "stopped", resume_from_checkpoint="latest",
                             **common)
        resumed = start(again, cls.processes, cls.tmp, root / "resumed.log")
        cls.resumed = finish(resumed, root / "resumed.log")

    def stops(self) -> dict[int, tuple[str, int]]:
        """rank -> (signal named, step) from each rank's 'preempted' line."""
        return {int(rank): (name, int(step))
                for rank, name, step in PREEMPTED.findall(self.stopped[1])}

    def test_every_rank_stops_at_one_step_with_a_checkpoint(self):
        self.assertEqual(self.full[0], 0, self.full[1][-3000:])
        stops = self.stops()
        self.assertEqual(sorted(stops), list(range(self.processes)), self.stopped[1][-3000:])
        self.assertEqual(stops[self.signalled_rank][0], "SIGTERM")
        (step,) = {step for _, step in stops.values()}
        accumulation = self.options["gradient_accumulation_steps"]
        self.assertGreaterEqual(step * accumulation, self.line, f"signalled at line {self.line}")
        self.assertLess(step, self.options["max_train_steps"])
        self.assertTrue((self.out / f"checkpoint-{step}" / "trainer_state.json").is_file())
        self.assertNotIn("exported the trained", self.stopped[1])

    def test_resumed_run_ends_with_the_uninterrupted_weights(self):
        self.assertEqual(self.resumed[0], 0, self.resumed[1][-3000:])
        self.assertIn("resumed from", self.resumed[1])
        full, resumed = unet(self.full_out), unet(self.out)
        self.assertEqual(full.keys(), resumed.keys())
        worst = max((full[k] - resumed[k]).abs().max().item() for k in full)
        self.assertLessEqual(worst, 1e-6, f"signalled at line {self.line}")

    def test_interrupted_and_resumed_traces_equal_the_uninterrupted_one(self):
        for rank in range(self.processes):
            full = read_jsonl(self.full_out / "trace" / f"rank-{rank}.jsonl")
            joined = read_jsonl(self.out / "trace" / f"rank-{rank}.jsonl")
            self.assertEqual(len(full), self.options["max_train_steps"]
                             * self.options["gradient_accumulation_steps"])
            self.assertEqual(joined, full, f"rank {rank}, signalled at line {self.line}")


class OneProcessPreemptionTest(PreemptedRun, unittest.TestCase):
    processes, signalled_rank = 1, 0
    options = dict(max_train_steps=12, gradient_accumulation_steps=2, lr_scheduler="cosine",
                   lr_warmup_steps=3, use_ema=True, ema_decay=0.9)

    def test_exit_status_is_preempted(self):
        self.assertEqual(self.stopped[0], 75, self.stopped[1][-3000:])


class TwoProcessPreemptionTest(PreemptedRun, unittest.TestCase):
    """SIGTERM to rank 1 only: rank 0 learns of it through the step's reduce."""

    processes, signalled_rank = 2, 1
    options = dict(max_train_steps=10, gradient_accumulation_steps=1, lr_scheduler="cosine",
                   lr_warmup_steps=3)

    def test_workers_exit_as_preempted(self):
        # The launcher itself reports a failed worker as 1; what it reports is the workers' 75.
        self.assertRegex(self.stopped[1], r"exitcode\s*:\s*75\b")


class WatcherTest(unittest.TestCase):
    def test_a_signal_sets_the_request_and_the_handler_is_restored(self):
        before = signal.getsignal(signal.SIGUSR1)
        with PreemptionWatcher(["SIGUSR1"]) as watcher:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.01)  # the handler runs between bytecodes of the main thread
            self.assertEqual(watcher.requested, "SIGUSR1")
            os.kill(os.getpid(), signal.SIGUSR1)  # a repeat before the save changes nothing
            time.sleep(0.01)
        self.assertEqual(watcher.requested, "SIGUSR1")
        self.assertIs(signal.getsignal(signal.SIGUSR1), before)

    def test_a_signal_during_the_save_aborts_it(self):
        before = signal.getsignal(signal.SIGUSR2)
        with PreemptionWatcher(["SIGUSR2"]) as watcher:
            with self.assertRaises(KeyboardInterrupt):
                with watcher.aborting_on_signal():
                    os.kill(os.getpid(), signal.SIGUSR2)
                    time.sleep(1)
            self.assertIs(signal.getsignal(signal.SIGUSR2), before)


if __name__ == "__main__":
    unittest.main()
