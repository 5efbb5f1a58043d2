"""./train.sh returns the training processes' own exit status (accelerate launch alone turns
every failure into 1), and a SIGTERM to it reaches the training process and leaves nothing
running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time
import unittest
from pathlib import Path

from simpletuner.training.run.output_dir_lock import LOCK_NAME, OutputDirLock
from simpletuner.training.run.outcomes import EXIT_CONFIG, EXIT_PREEMPTED

from launching import REPO, Launch
from training_fixtures import environment, make_shapes, run_train_sh, write_config


def is_training(pid: int) -> bool:
    """A training process, not the launcher that started it."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"simpletuner.train" in command and b"launch" not in command


def wait_until(condition, timeout: float, what: str, alive=None) -> None:
    """Poll ``condition``; fail after ``timeout``, or at once when process ``alive`` ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"exited with {alive.returncode} before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


class TrainShTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-train-sh-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_a_config_error_on_two_processes_is_status_2(self):
        # fp16 without CUDA is found by the preflight (it asks torch), after launch, on every rank.
        config = write_config(self.root, self.root / "data", "config-error", num_processes=2,
                              mixed_precision="fp16")
        result = run_train_sh(config, self.tmp, timeout=180)
        self.assertEqual(result.returncode, EXIT_CONFIG, result.stderr[-3000:])
        for rank in (0, 1):
            self.assertIn(f"[rank {rank}] training stopped (exit status 2)", result.stderr)
        self.assertIn("'fp16', which needs a CUDA device", result.stderr)
        self.assert_no_launcher_traceback(result.stderr)
        # Refused after the lock was taken: released on the way out.
        self.assertFalse((self.root / "config-error-out" / LOCK_NAME).exists())

    def test_a_fresh_run_over_checkpoints_is_refused_before_launch(self):
        config = write_config(self.root, self.root / "data", "fresh", num_processes=2,
                              max_train_steps=None)
        (self.root / "fresh-out" / "checkpoint-3").mkdir(parents=True)
        result = run_train_sh(config, self.tmp, timeout=180)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, EXIT_CONFIG, output[-3000:])
        self.assertIn("earlier run's checkpoints (checkpoint-3)", output)
        self.assertIn("set 'max_train_steps' or 'num_train_epochs'", output)  # all at once
        self.assert_not_launched(output)
        self.assertFalse((self.root / "fresh-out" / LOCK_NAME).exists())

    def test_a_wrong_model_path_is_refused_before_launch(self):
        config = write_config(self.root, self.root / "data", "no-model", num_processes=2,
                              pretrained_model_name_or_path=str(self.root / "no-such-model"))
        result = run_train_sh(config, self.tmp, timeout=180)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, EXIT_CONFIG, output[-3000:])
        self.assertIn("no-such-model' is not a local folder", output)
        self.assert_not_launched(output)

    def test_an_output_dir_in_use_is_refused_before_launch(self):
        config = write_config(self.root, self.root / "data", "in-use")
        holder = OutputDirLock(self.root / "in-use-out")  # this test process: alive
        self.assertIsNone(holder.try_acquire())
        self.addCleanup(holder.release)
        result = run_train_sh(config, self.tmp, timeout=180)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, EXIT_CONFIG, output[-3000:])
        self.assertIn(f"is in use by another run (pid {os.getpid()}", output)
        self.assert_not_launched(output)

    def test_only_eval_datasets_are_refused_before_launch(self):
        config = write_config(self.root, self.root / "data", "eval-only", datasets=[
            {"id": "held-out", "dataset_type": "eval",
             "instance_data_dir": str(self.root / "data")}])
        result = run_train_sh(config, self.tmp, timeout=180)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, EXIT_CONFIG, output[-3000:])
        self.assertIn(f"{self.root / 'eval-only-multidatabackend.json'}: every enabled dataset "
                      "has 'dataset_type': 'eval' (dataset [0] (id 'held-out'))", output)
        self.assert_not_launched(output)
        self.assertFalse((self.root / "eval-only-out").exists())  # no model load, no cache

    def test_a_lock_this_trainer_did_not_write_is_refused_before_launch(self):
        # Without process_start the run would refuse it after launch; check must see it first.
        config = write_config(self.root, self.root / "data", "foreign-lock")
        lock = self.root / "foreign-lock-out" / LOCK_NAME
        lock.parent.mkdir()
        lock.write_text(json.dumps({"pid": os.getpid(), "host": "here", "started": "today"}))
        result = run_train_sh(config, self.tmp, timeout=180)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, EXIT_CONFIG, output[-3000:])
        self.assertIn(f"key 'output_dir': {lock} is not a lock this trainer wrote (missing "
                      "process_start); if no run is using", output)
        self.assert_not_launched(output)
        self.assertTrue(lock.exists())

    def test_an_output_dir_inside_the_dataset_is_refused_before_launch(self):
        # The next run would train on this one's validation images (caption_strategy filename).
        output_dir = self.root.resolve() / "data" / "out"
        config = write_config(self.root, self.root / "data", "in-data", max_train_steps=None,
                              output_dir=str(output_dir))
        result = run_train_sh(config, self.tmp, timeout=180)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, EXIT_CONFIG, output[-3000:])
        self.assertIn(f"{config}: key 'output_dir' ({output_dir}) is inside", output)
        self.assertIn("set 'max_train_steps' or 'num_train_epochs'", output)  # all at once
        self.assert_not_launched(output)
        self.assertFalse(output_dir.exists())

    def assert_not_launched(self, output: str) -> None:
        for launched in ("Traceback", "CalledProcessError", "training stopped", "accelerate"):
            self.assertNotIn(launched, output)

    def assert_no_launcher_traceback(self, output: str) -> None:
        # The processes' own lines are the whole report (accelerate would add its traceback).
        for launcher_said in ("Traceback", "CalledProcessError", "ChildFailedError"):
            self.assertNotIn(launcher_said, output)

    def test_a_bucket_smaller_than_the_batch_is_status_2_with_its_report(self):
        # Two images and batches of four: the bucket cannot fill one batch. Known before any
        # step and fixed by settings, so a configuration status, not a failure.
        config = write_config(self.root, self.root / "data", "undersized", train_batch_size=4)
        result = run_train_sh(config, self.tmp, timeout=180)
        self.assertEqual(result.returncode, EXIT_CONFIG, result.stderr[-3000:])
        self.assertIn("[rank 0] training stopped (exit status 2): Dataset 'shapes' has buckets "
                      "smaller than the effective batch size E = 4", result.stderr)
        self.assertIn("Fixes: a smaller train_batch_size", result.stderr)
        self.assert_no_launcher_traceback(result.stderr)

    def test_sigterm_reaches_the_training_process_and_leaves_nothing_running(self):
        self.check_sigterm_through_train_sh(processes=1)

    def test_sigterm_stops_every_rank_of_two_with_a_checkpoint(self):
        self.check_sigterm_through_train_sh(processes=2)

    def check_sigterm_through_train_sh(self, processes: int):
        name = f"signal-{processes}"
        # Two images: one per rank and micro-batch, so two processes fill a batch.
        config = write_config(self.root, self.root / "data", name, max_train_steps=100000,
                              num_processes=processes, train_batch_size=1)
        with Launch([REPO / "train.sh", config], tmpdir=self.tmp,
                    env=environment(self.tmp)) as launcher_script:
            wait_until(lambda: "training sd1x" in launcher_script.stderr(), 180,
                       "the training loop", alive=launcher_script.process)
            training = [p for p in launcher_script.processes() if is_training(p)]
            self.assertEqual(len(training), processes, launcher_script.processes())
            launcher_script.process.send_signal(signal.SIGTERM)
            status = launcher_script.wait(timeout=120)
            # Whatever its session or parent now: every process started under train.sh ended.
            wait_until(lambda: not launcher_script.processes(), 10, "the process tree to end")
        output = launcher_script.stderr()
        # The progress bar may share the line (it ends in \r, not \n).
        (forwarded,) = re.findall(r"train\.sh: forwarding SIGTERM to ([\d ]+)$", output, re.M)
        self.assertEqual(sorted(map(int, forwarded.split())), sorted(training))
        # The training loop turns SIGTERM into a checkpoint at the next step and status 75.
        self.assertEqual(status, EXIT_PREEMPTED, output[-3000:])
        self.assertIn("preempted by SIGTERM", output)
        self.assertTrue(list((self.root / f"{name}-out").glob("checkpoint-*/manifest.json")),
                        output[-3000:])
        self.assertFalse((self.root / f"{name}-out" / LOCK_NAME).exists())


if __name__ == "__main__":
    unittest.main()
