"""Traces after a resume: the lines a crashed run wrote past its checkpoint are cut off, so the
trace of a crashed-and-resumed run equals the uninterrupted run's, line for line."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import unittest
from pathlib import Path

from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
from simpletuner.helpers.multiaspect.trace import TraceWriter, read_trace, trace_path
from launching import Launch
from training_fixtures import (environment, make_shapes, run_in_process_logged, run_training,
                               write_config)


def batch(epoch: int, step: int) -> MicroBatch:
    sample = BatchSample("d", f"{epoch}-{step}.png", "64x64", (64, 64), "a caption")
    return MicroBatch(epoch, step, "d", "64x64", (sample,))


def positions(records: list[dict]) -> list[tuple[int, int]]:
    return [(r["epoch"], r["step"]) for r in records]


class TruncateOnResumeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.folder = Path(self.tmp.name)
        # A crashed run: epoch 0 steps 0-3, epoch 1 steps 0-2, then a line torn by the crash.
        with TraceWriter(self.folder, 0) as writer:
            for epoch, steps in ((0, 4), (1, 3)):
                for step in range(steps):
                    writer.write(batch(epoch, step))
        with open(trace_path(self.folder, 0), "a", encoding="utf-8") as handle:
            handle.write('{"epoch":1,"st')

    def tearDown(self):
        self.tmp.cleanup()

    def test_resume_keeps_the_lines_before_the_position_then_appends(self):
        with TraceWriter(self.folder, 0, resume_at=(1, 1)) as writer:
            writer.write(batch(1, 1))
            writer.write(batch(1, 2))
        self.assertEqual(positions(read_trace(self.folder, 0)),
                         [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)])

    def test_resume_at_the_end_of_an_epoch_keeps_that_epoch(self):
        # A checkpoint after an epoch's last micro-batch saves (epoch, len) before the next epoch.
        with TraceWriter(self.folder, 0, resume_at=(0, 4)):
            pass
        self.assertEqual(positions(read_trace(self.folder, 0)), [(0, 0), (0, 1), (0, 2), (0, 3)])

    def test_resume_at_the_start_empties_the_trace(self):
        with TraceWriter(self.folder, 0, resume_at=(0, 0)):
            pass
        self.assertEqual(trace_path(self.folder, 0).read_text(), "")

    def test_resume_without_an_earlier_trace_starts_one(self):
        with TraceWriter(self.folder, 3, resume_at=(2, 5)) as writer:
            writer.write(batch(2, 5))
        self.assertEqual(positions(read_trace(self.folder, 3)), [(2, 5)])

    def test_a_fresh_run_replaces_an_old_trace(self):
        with TraceWriter(self.folder, 0) as writer:
            writer.write(batch(0, 0))
        self.assertEqual(positions(read_trace(self.folder, 0)), [(0, 0)])

    def test_no_temporary_file_is_left_beside_the_trace(self):
        with TraceWriter(self.folder, 0, resume_at=(1, 0)):
            pass
        self.assertEqual(sorted(p.name for p in self.folder.iterdir()), ["rank-0.jsonl"])


class KilledAndResumedTrainingTest(unittest.TestCase):
    """A run killed (SIGKILL) after writing trace lines past its checkpoint-3, then resumed from
    it, leaves the trace of an uninterrupted 6-step run. 2 buckets x 5 samples, batch 2
    (bucket_tail carry): epoch 0 trains 4 per bucket in 4 micro-batches and carries one
    occurrence per bucket into epoch 1, so the kill and the resume cross an epoch boundary that
    a carry crosses too. The uninterrupted run's log is checked for what it must say."""

    OPTIONS = dict(checkpointing_steps=3, trace_samples=True, seed=11)
    CHECKPOINT_STEP, KILL_AFTER_LINES = 3, 5

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-trace-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=5)
        (cls.root / "data" / "broken.png").write_bytes(b"not an image")
        cls.full = run_training(write_config(cls.root, cls.root / "data", "full",
                                             max_train_steps=6, **cls.OPTIONS), cls.tmp)
        cls.crashed_out = cls.root / "crashed-out"
        cls.lines_at_kill = cls._train_until_killed()
        cls.resumed = run_in_process_logged(write_config(  # in this process: what it traces
            cls.root, cls.root / "data", "crashed", max_train_steps=6,
            resume_from_checkpoint="latest", **cls.OPTIONS), cls.tmp)

    @classmethod
    def _train_until_killed(cls) -> list[str]:
        # A long run, so it is still going when the checkpoint and the extra lines are there.
        config = write_config(cls.root, cls.root / "data", "crashed", max_train_steps=10_000,
                              **cls.OPTIONS)
        trace = cls.crashed_out / "trace" / "rank-0.jsonl"
        checkpoint = cls.crashed_out / f"checkpoint-{cls.CHECKPOINT_STEP}"
        # Leaving the block is the crash: SIGKILL to the run and everything it started.
        with Launch([sys.executable, "-m", "simpletuner.train", "--config", config],
                    tmpdir=cls.tmp, env=environment(cls.tmp)) as run:
            deadline = time.monotonic() + 300
            while run.process.poll() is None and time.monotonic() < deadline:
                if (checkpoint.is_dir() and trace.is_file()
                        and len(trace.read_text().splitlines()) >= cls.KILL_AFTER_LINES):
                    break
                time.sleep(0.02)
        # As if the crash came before any later checkpoint: resume must use checkpoint-3.
        for later in cls.crashed_out.glob("checkpoint-*"):
            if later != checkpoint:
                shutil.rmtree(later)
        return trace.read_text().splitlines() if trace.is_file() else []

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_runs_succeed(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-3000:])
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertIn("resumed from", self.resumed.stderr)

    def test_the_log_names_skipped_files_and_each_epochs_carry(self):
        log = self.full.stderr
        self.assertIn("1 files were skipped", log)
        self.assertIn("  shapes: broken.png: ", log)
        self.assertIn(str(self.root / "full-out" / "skipped_files.json"), log)
        # Each epoch's line goes to the log file; the console names the file once.
        epochs_log = self.root / "full-out" / "logs" / "epochs.log"
        self.assertIn(f"is logged to {epochs_log}", log)
        self.assertNotIn("the split carries", log)
        epochs = epochs_log.read_text()
        self.assertRegex(epochs, r"epoch 0: the split carries 2 occurrences .* into epoch 1 "
                                 r"from 2 buckets: shapes \d+x\d+: 1, shapes \d+x\d+: 1\n")
        # (1 carried in + 5) per bucket fills 3 micro-batches of 2: nothing carried on.
        self.assertIn("epoch 1: 2 occurrences carried from epoch 0 train first\n", epochs)

    def test_the_killed_run_wrote_past_its_checkpoint(self):
        self.assertGreaterEqual(len(self.lines_at_kill), self.KILL_AFTER_LINES)
        self.assertGreater(len(self.lines_at_kill), self.CHECKPOINT_STEP)

    def test_resumed_trace_equals_the_uninterrupted_trace_line_for_line(self):
        full = (self.root / "full-out" / "trace" / "rank-0.jsonl").read_text().splitlines()
        resumed = (self.crashed_out / "trace" / "rank-0.jsonl").read_text().splitlines()
        self.assertEqual(len(full), 6)
        self.assertEqual(resumed, full)


if __name__ == "__main__":
    unittest.main()
