"""Preemption: a stop signal sent to a real training process at a random step becomes a
checkpoint at the next step boundary and exit status 75; resuming with 'latest' ends exactly as
the uninterrupted run (weights and sample trace). With two processes the signal goes to one
rank only, and the agreement makes both stop at the same step. The step is seeded: a failure
names its seed, and TEST_PREEMPTION_SEED=that seed signals at the same step again."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest
from pathlib import Path

from safetensors.torch import load_file

from simpletuner.training.run.preemption import PreemptionWatcher
from launching import Launch
from training_fixtures import (ReportView, environment, make_shapes, read_jsonl, read_report,
                               write_config)

TIMEOUT = 240
SEED_VARIABLE = "TEST_PREEMPTION_SEED"  # set to a failure's seed to signal at its micro-batch
PREEMPTED = re.compile(
    r"\[rank (\d)\] training stopped \(exit status 75\): preempted by (.+?) at step (\d+)")


def train_command(config: Path, processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable, "-m", "simpletuner.train", "--config", str(config)]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
            str(processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no", "--main_process_port", "0",
            "-m", "simpletuner.train", "--config", str(config)]


def start(config: Path, processes: int, tmpdir: str) -> Launch:
    env = environment(tmpdir)
    env["ACCELERATE_USE_CPU"] = "true"
    return Launch(train_command(config, processes), tmpdir=tmpdir, env=env)


def finish(run: Launch) -> tuple[int, str]:
    """The run's status and stderr; a run past TIMEOUT fails with every process killed."""
    with run:
        status = run.wait(TIMEOUT)
    return status, run.stderr()


def worker_pid(run: Launch, rank: int) -> int | None:
    """The process of ``run`` that accelerate started as ``rank``."""
    for pid in run.processes():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if pid != run.pid and f"RANK={rank}".encode() in environ:
            return pid
    return None


def signal_at_line(run: Launch, trace: Path, line: int, target: int) -> None:
    """Send SIGTERM to ``target`` once ``trace`` shows ``line`` micro-batches."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and run.process.poll() is None:
        if trace.is_file() and len(trace.read_text().splitlines()) >= line:
            os.kill(target, signal.SIGTERM)
            return
        time.sleep(0.02)
    raise AssertionError(f"the run ended or stalled before micro-batch {line}")


def unet(folder: Path) -> dict:
    return load_file(str(folder / "pipeline" / "unet" / "diffusion_pytorch_model.safetensors"))


def preemption_seed() -> int:
    """The seed of the signalled micro-batch: SEED_VARIABLE's, to repeat a run, else new."""
    given = os.environ.get(SEED_VARIABLE)
    return int(given) if given else random.SystemRandom().randrange(2**32)


class PreemptedRun:
    """Mixed into a TestCase: an uninterrupted run alongside one signalled at a seeded random
    micro-batch, then the signalled run resumed in its own output folder with 'latest'. Every
    failure names the micro-batch and how to repeat it (``rerun``)."""

    processes: int
    signalled_rank: int
    options: dict

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-preempt-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        lines = cls.options["max_train_steps"] * cls.options["gradient_accumulation_steps"]
        seed = preemption_seed()
        cls.line = random.Random(seed).randrange(2, lines // 2)
        cls.rerun = (f"signalled at micro-batch {cls.line}; to repeat: {SEED_VARIABLE}={seed} "
                     f"python -m pytest tests/test_preemption.py -k {cls.__name__}")
        try:
            cls.run_all(Path(cls.tmp))
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{cls.rerun}") from None

    @classmethod
    def run_all(cls, root: Path) -> None:
        make_shapes(root / "data", per_size=4)
        common = dict(cls.options, num_processes=cls.processes, trace_samples=True)
        cls.full_out, cls.out = root / "full-out", root / "stopped-out"
        full = start(write_config(root, root / "data", "full", **common), cls.processes, cls.tmp)
        cls.addClassCleanup(full.close)
        stopped = start(write_config(root, root / "data", "stopped", **common), cls.processes,
                        cls.tmp)
        cls.addClassCleanup(stopped.close)
        target = stopped.pid if cls.processes == 1 else None
        try:
            while target is None and stopped.process.poll() is None:
                target = worker_pid(stopped, cls.signalled_rank)
                time.sleep(0.05)
            if target is None:
                raise AssertionError(f"no worker of rank {cls.signalled_rank} was found")
            signal_at_line(stopped, cls.out / "trace" / f"rank-{cls.signalled_rank}.jsonl",
                           cls.line, target)
        finally:
            cls.stopped = finish(stopped)
            cls.full = finish(full)
        page = cls.out / "training_report.html"  # the resumed run rewrites it
        cls.stopped_report = ReportView(page.read_text()) if page.is_file() else None
        again = write_config(root, root / "data", "stopped", resume_from_checkpoint="latest",
                             **common)
        cls.resumed = finish(start(again, cls.processes, cls.tmp))

    def stops(self) -> dict[int, tuple[str, int]]:
        """rank -> (signal named, step) from each rank's 'preempted' line."""
        return {int(rank): (name, int(step))
                for rank, name, step in PREEMPTED.findall(self.stopped[1])}

    def test_every_rank_stops_at_one_step_with_a_checkpoint(self):
        self.assertEqual(self.full[0], 0, f"{self.full[1][-3000:]}\n{self.rerun}")
        stops = self.stops()
        self.assertEqual(sorted(stops), list(range(self.processes)),
                         f"{self.stopped[1][-3000:]}\n{self.rerun}")
        self.assertEqual(stops[self.signalled_rank][0], "SIGTERM", self.rerun)
        (step,) = {step for _, step in stops.values()}
        accumulation = self.options["gradient_accumulation_steps"]
        self.assertGreaterEqual(step * accumulation, self.line, self.rerun)
        self.assertLess(step, self.options["max_train_steps"], self.rerun)
        self.assertTrue((self.out / f"checkpoint-{step}" / "trainer_state.json").is_file(),
                        self.rerun)
        self.assertNotIn("exported the trained", self.stopped[1], self.rerun)

    def test_resumed_run_ends_with_the_uninterrupted_weights(self):
        self.assertEqual(self.resumed[0], 0, f"{self.resumed[1][-3000:]}\n{self.rerun}")
        self.assertIn("resumed from", self.resumed[1], self.rerun)
        full, resumed = unet(self.full_out), unet(self.out)
        self.assertEqual(full.keys(), resumed.keys(), self.rerun)
        worst = max((full[k] - resumed[k]).abs().max().item() for k in full)
        self.assertLessEqual(worst, 1e-6, self.rerun)

    def test_the_reports_say_preempted_and_the_resumed_one_continues_the_same_curve(self):
        self.assertIsNotNone(self.stopped_report, f"no report after the stop; {self.rerun}")
        self.assertEqual(self.stopped_report.status, "preempted", self.rerun)
        stopped = self.stopped_report.series["loss"]
        resumed, full = read_report(self.out), read_report(self.full_out)
        self.assertEqual(resumed.status, "finished", self.rerun)
        page = (self.out / "training_report.html").read_text()  # every rank's trace, checked
        self.assertIn("OK: every kept occurrence assigned exactly once", page, self.rerun)
        self.assertEqual(resumed.series["loss"][:len(stopped)], stopped, self.rerun)
        self.assertEqual([s for s, _ in resumed.series["loss"]],
                         [s for s, _ in full.series["loss"]], self.rerun)
        for (step, value), (_, expected) in zip(resumed.series["loss"], full.series["loss"]):
            self.assertAlmostEqual(value, expected, delta=1e-5 * abs(expected),
                                   msg=f"step {step}; {self.rerun}")

    def test_interrupted_and_resumed_traces_equal_the_uninterrupted_one(self):
        for rank in range(self.processes):
            full = read_jsonl(self.full_out / "trace" / f"rank-{rank}.jsonl")
            joined = read_jsonl(self.out / "trace" / f"rank-{rank}.jsonl")
            self.assertEqual(len(full), self.options["max_train_steps"]
                             * self.options["gradient_accumulation_steps"], self.rerun)
            self.assertEqual(joined, full, f"rank {rank}, {self.rerun}")


class OneProcessPreemptionTest(PreemptedRun, unittest.TestCase):
    processes, signalled_rank = 1, 0
    options = dict(max_train_steps=12, gradient_accumulation_steps=2, lr_scheduler="cosine",
                   lr_warmup_steps=3, use_ema=True, ema_decay=0.9)

    def test_exit_status_is_preempted(self):
        self.assertEqual(self.stopped[0], 75, f"{self.stopped[1][-3000:]}\n{self.rerun}")


class TwoProcessPreemptionTest(PreemptedRun, unittest.TestCase):
    """SIGTERM to rank 1 only: rank 0 learns of it through the step's reduce."""

    processes, signalled_rank = 2, 1
    options = dict(max_train_steps=10, gradient_accumulation_steps=1, lr_scheduler="cosine",
                   lr_warmup_steps=3)

    def test_workers_exit_as_preempted(self):
        # The launcher itself reports a failed worker as 1; what it reports is the workers' 75.
        self.assertRegex(self.stopped[1], r"exitcode\s*:\s*75\b", self.rerun)


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
