"""One run per output_dir: the lock (held, stale, reused pid, another host, released) and the
refusal of a fresh run over an earlier run's checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import unittest
from dataclasses import asdict, replace
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.training.checkpointing.checkpointer import RUN_STATE
from simpletuner.training.run.output_dir_lock import LOCK_NAME, LockOwner, OutputDirLock, _process_start
from simpletuner.training.checkpointing.manifest import write_manifest
from simpletuner.training.preflight import run_preflight

from launching import Launch
from training_fixtures import make_shapes, run_training, write_config


def write_lock(output_dir: Path, owner: LockOwner) -> Path:
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_NAME
    path.write_text(json.dumps(asdict(owner)))
    return path


def owner_of(pid: int, host: str | None = None) -> LockOwner:
    return LockOwner(pid, host or socket.gethostname(), "2026-01-02T03:04:05+00:00",
                     _process_start(pid))


def dead_pid(tmpdir: Path) -> int:
    with Launch([sys.executable, "-c", "pass"], tmpdir=tmpdir) as finished:
        finished.wait(timeout=60)
    return finished.pid


def live_process(test: unittest.TestCase, tmpdir: Path) -> int:
    """The pid of a process that runs until ``test`` has ended."""
    sleeper = Launch([sys.executable, "-c", "import time; time.sleep(120)"], tmpdir=tmpdir)
    test.addCleanup(sleeper.close)
    return sleeper.pid


def make_checkpoint(output_dir: Path, step: int) -> None:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / RUN_STATE).write_text(json.dumps(
        {"step": step, "epoch": 0, "seed": 7, "fingerprint": {}, "model_type": "full"}))
    write_manifest(folder)  # only a manifest makes a folder a checkpoint


class LockTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-lock-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.output_dir = self.tmp / "out"

    def test_a_free_output_dir_is_taken_and_released(self):
        lock = OutputDirLock(self.output_dir)
        self.assertIsNone(lock.try_acquire())
        held = json.loads((self.output_dir / LOCK_NAME).read_text())
        self.assertEqual((held["pid"], held["host"]), (os.getpid(), socket.gethostname()))
        self.assertEqual(sorted(p.name for p in self.output_dir.iterdir()), [LOCK_NAME])
        lock.release()
        self.assertFalse((self.output_dir / LOCK_NAME).exists())

    def test_a_lock_held_by_a_live_process_is_refused_naming_it(self):
        holder = owner_of(live_process(self, self.tmp))
        path = write_lock(self.output_dir, holder)
        problem = OutputDirLock(self.output_dir).try_acquire()
        self.assertIsNotNone(problem)
        for fragment in (f"pid {holder.pid}", holder.host, holder.started, str(path),
                         "use another output_dir", "delete the lock file"):
            self.assertIn(fragment, problem)
        self.assertEqual(LockOwner(**json.loads(path.read_text())), holder)

    def test_a_second_lock_in_this_process_is_refused(self):
        self.assertIsNone(OutputDirLock(self.output_dir).try_acquire())
        self.assertIn(f"pid {os.getpid()}", OutputDirLock(self.output_dir).try_acquire())

    def test_a_stale_lock_is_taken_over_with_a_warning(self):
        path = write_lock(self.output_dir, owner_of(dead_pid(self.tmp)))
        lock = OutputDirLock(self.output_dir)
        with self.assertLogs("simpletuner.training.run.output_dir_lock", "WARNING") as logs:
            self.assertIsNone(lock.try_acquire())
        self.assertIn(f"{path} was left by pid", logs.output[0])
        self.assertIn("; it no longer runs; taking it over", logs.output[0])
        self.assertEqual(LockOwner(**json.loads(path.read_text())), lock.owner)

    def test_a_stale_lock_another_run_took_over_first_is_left_alone(self):
        stale = owner_of(dead_pid(self.tmp))
        taken_over = write_lock(self.output_dir, owner_of(live_process(self, self.tmp)))
        # what the slower of two runs does
        OutputDirLock(self.output_dir)._remove_stale(stale, "it no longer runs")
        self.assertTrue(taken_over.exists())

    def test_a_pid_reused_by_a_later_process_is_stale(self):
        # A restarted container: the lock's pid now belongs to another process.
        reused = replace(owner_of(live_process(self, self.tmp)), process_start="1")
        write_lock(self.output_dir, reused)
        self.assertIsNone(OutputDirLock(self.output_dir).in_use_problem())  # check lets it be
        with self.assertLogs("simpletuner.training.run.output_dir_lock", "WARNING") as logs:
            self.assertIsNone(OutputDirLock(self.output_dir).try_acquire())
        # The pid runs: the warning says it is another process, not that the pid is gone.
        self.assertIn(f"; a different process now uses pid {reused.pid} (it started later); "
                      "taking it over", logs.output[0])
        self.assertNotIn("no longer runs", logs.output[0])

    def test_a_lock_from_another_host_is_not_taken_over(self):
        write_lock(self.output_dir, owner_of(dead_pid(self.tmp), host="elsewhere.example"))
        self.assertIn("on host elsewhere.example", OutputDirLock(self.output_dir).try_acquire())

    def test_an_unreadable_lock_is_refused_with_what_to_do(self):
        self.output_dir.mkdir(parents=True)
        (self.output_dir / LOCK_NAME).write_text("{not json")
        problem = OutputDirLock(self.output_dir).try_acquire()
        self.assertIn("is not a lock this trainer wrote", problem)
        self.assertIn("delete that file", problem)
        self.assertEqual(OutputDirLock(self.output_dir).in_use_problem(), problem)

    def test_a_lock_of_another_shape_is_refused_by_check_as_by_the_run(self):
        live = asdict(owner_of(live_process(self, self.tmp)))
        for name, written, named in (
                ("no process_start", {k: v for k, v in live.items() if k != "process_start"},
                 "(missing process_start)"),
                ("a text pid", {**live, "pid": str(live["pid"])}, "values of other types"),
                ("a list", [live], "(a JSON list, not an object)"),
                ("not UTF-8", b"\xff\xfe", "is not a lock this trainer wrote")):
            with self.subTest(name):
                self.output_dir.mkdir(parents=True, exist_ok=True)
                path = self.output_dir / LOCK_NAME
                if isinstance(written, bytes):
                    path.write_bytes(written)
                else:
                    path.write_text(json.dumps(written))
                checked = OutputDirLock(self.output_dir).in_use_problem()
                self.assertIn(named, checked)
                self.assertIn(f"{path} is not a lock this trainer wrote", checked)
                self.assertEqual(OutputDirLock(self.output_dir).try_acquire(), checked)
                self.assertTrue(path.exists())  # left for the user to delete

    def test_release_leaves_a_lock_that_is_not_ours(self):
        lock = OutputDirLock(self.output_dir)
        self.assertIsNone(lock.try_acquire())
        other = write_lock(self.output_dir, owner_of(live_process(self, self.tmp)))
        with self.assertLogs("simpletuner.training.run.output_dir_lock", "WARNING"):
            lock.release()
        self.assertTrue(other.exists())


class FreshRunRefusalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-fresh-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def configuration(self, name: str, **options):
        config = write_config(self.root, self.root / "data", name, **options)
        return load_configuration(config)

    def test_a_fresh_run_over_old_checkpoints_is_refused_naming_them(self):
        configuration = self.configuration("old")
        output_dir = Path(configuration.training.output_dir)
        for step in (10, 2):
            make_checkpoint(output_dir, step)
        (output_dir / "checkpoint-30").mkdir()  # incomplete, still an earlier run's
        with self.assertRaises(ConfigError) as caught:
            run_preflight(configuration)
        (problem,) = caught.exception.problems
        self.assertIn("checkpoint-2, checkpoint-10, checkpoint-30", problem)
        self.assertIn("resume_from_checkpoint", problem)
        self.assertIn("'latest'", problem)
        self.assertIn("new or emptied output_dir", problem)

    def test_resuming_over_old_checkpoints_is_allowed(self):
        configuration = self.configuration("resumed", resume_from_checkpoint="latest")
        output_dir = Path(configuration.training.output_dir)
        make_checkpoint(output_dir, 4)
        preflight = run_preflight(configuration)
        self.assertEqual(preflight.resume_from, output_dir / "checkpoint-4")
        self.assertEqual(preflight.resume_step, 4)  # the events after it are cut away

    def test_other_folders_do_not_count_as_checkpoints(self):
        configuration = self.configuration("other")
        output_dir = Path(configuration.training.output_dir)
        for name in ("checkpoint-latest", ".incomplete-checkpoint-3", "pipeline"):
            (output_dir / name).mkdir(parents=True)
        self.assertIsNone(run_preflight(configuration).resume_from)


class EntryPointLockTest(unittest.TestCase):
    """Through `python -m simpletuner.train`: a run takes the lock and releases it at the end;
    a run on a locked output_dir stops with exit status 2 before any heavy work."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-lock-run-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_lock_is_released_after_a_run_ends(self):
        config = write_config(self.root, self.root / "data", "done", max_train_steps=1)
        result = run_training(config, self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertTrue((self.root / "done-out" / "training_summary.json").is_file())
        self.assertFalse((self.root / "done-out" / LOCK_NAME).exists())

    def test_a_run_on_a_locked_output_dir_is_refused(self):
        sleeper = live_process(self, self.root)
        config = write_config(self.root, self.root / "data", "locked")
        lock = write_lock(self.root / "locked-out", owner_of(sleeper))
        result = run_training(config, self.tmp, timeout=120)
        self.assertEqual(result.returncode, 2, result.stderr[-3000:])
        self.assertIn(f"is in use by another run (pid {sleeper} on host", result.stderr)
        self.assertIn("key 'output_dir'", result.stderr)
        self.assertTrue(lock.exists())
        self.assertFalse((self.root / "locked-out" / "cache").exists())  # no heavy work


if __name__ == "__main__":
    unittest.main()
