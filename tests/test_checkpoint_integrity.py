"""Checkpoint integrity: a damaged checkpoint is never resumed from (`latest` falls back to the
one before, with one warning naming the file), nothing non-finite is saved or loaded, pruning
keeps what matters, and a failed save (a real full disk, a real file-size limit, one rank of
two) leaves no staging folder and ends every rank with the same one-line error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import save_file

from launching import run_bounded
from simpletuner.common.together import RankFailure
from simpletuner.training.checkpointing.checkpointer import Checkpointer
from simpletuner.training.checkpointing.folders import resolve_resume
from simpletuner.training.ema import EMAWeights
from simpletuner.training.run_state import RunState
from checkpoint_parts import parts_for
from simpletuner.training.checkpointing.manifest import CheckpointError, verify_checkpoint, write_manifest
from simpletuner.training.checkpointing.tensor_state import FULL_WEIGHTS, load_weights

TESTS = Path(__file__).resolve().parent
RUNNER = TESTS / "checkpoint_fault_runner.py"
LOGGER = "simpletuner.training.checkpointing.folders"


class SmallRun:
    """A trained Linear layer with optimizer state and EMA, saved by the real Checkpointer."""

    def __init__(self, features: int = 64):
        torch.manual_seed(0)
        self.network = torch.nn.Linear(features, features)
        self.optimizer = torch.optim.AdamW(self.network.parameters(), lr=1e-2)
        self.network(torch.randn(2, features)).sum().backward()
        self.optimizer.step()
        self.ema = EMAWeights(self.network, 0.9)
        self.accelerator = Accelerator(cpu=True)

    def save(self, out: Path, step: int, **options) -> Path:
        state = RunState(step=step, epoch=0, seed=3, fingerprint={}, model_type="full")
        checkpointer = Checkpointer(self.accelerator, out, **options)
        return checkpointer.save(state, parts_for(self.network, self.optimizer, ema=self.ema,
                                                  step=step))

    def load(self, folder: Path) -> tuple[RunState, dict]:
        parts = parts_for(self.network, self.optimizer, ema=self.ema)
        state = Checkpointer(self.accelerator, folder.parent).load(folder, parts)
        return state, parts.sampler.state_dict()


def overwrite_with_random_bytes(folder: Path) -> Path:
    path = folder / FULL_WEIGHTS
    with open(path, "r+b") as handle:  # the tensor data, past the header: same size
        handle.seek(path.stat().st_size - 2500)
        handle.write(os.urandom(2000))
    return path


def truncate(folder: Path) -> Path:
    path = folder / FULL_WEIGHTS
    os.truncate(path, path.stat().st_size // 2)
    return path


def remove_optimizer_tensors(folder: Path) -> Path:
    path = folder / "optimizer.safetensors"
    path.unlink()
    return path


def garble_manifest(folder: Path) -> Path:
    path = folder / "manifest.json"
    path.write_text("{\"format\": 1, \"files\":")
    return path


CORRUPTIONS = {"SHA-256 mismatch": overwrite_with_random_bytes, "size mismatch": truncate,
               "missing file": remove_optimizer_tensors, "unreadable manifest": garble_manifest}


class DamagedCheckpointTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-ckpt-"))
        self.run = SmallRun()

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def two_checkpoints(self, name: str) -> Path:
        out = self.tmp / name
        self.run.save(out, 2)
        self.run.save(out, 4)
        return out

    def test_latest_falls_back_to_the_previous_checkpoint_with_one_warning(self):
        for reason, corrupt in CORRUPTIONS.items():
            with self.subTest(reason):
                out = self.two_checkpoints(corrupt.__name__)
                damaged = corrupt(out / "checkpoint-4")
                with self.assertLogs(LOGGER, "WARNING") as logs:
                    self.assertEqual(resolve_resume("latest", out), out / "checkpoint-2")
                self.assertEqual(len(logs.records), 1, logs.output)
                self.assertIn(str(damaged), logs.output[0])
                self.assertIn(reason, logs.output[0])

    def test_an_explicit_damaged_checkpoint_is_an_error_naming_the_file(self):
        for reason, corrupt in CORRUPTIONS.items():
            with self.subTest(reason):
                out = self.two_checkpoints(corrupt.__name__)
                damaged = corrupt(out / "checkpoint-4")
                with self.assertRaises(CheckpointError) as caught:
                    resolve_resume(str(out / "checkpoint-4"), out)
                self.assertIn(str(damaged), str(caught.exception))
                self.assertIn(reason, str(caught.exception))

    def test_latest_with_every_checkpoint_damaged_is_an_error(self):
        out = self.two_checkpoints("all")
        truncate(out / "checkpoint-2"), truncate(out / "checkpoint-4")
        with self.assertLogs(LOGGER, "WARNING"), self.assertRaises(CheckpointError) as caught:
            resolve_resume("latest", out)
        self.assertIn("no checkpoint", str(caught.exception))

    def test_a_checkpoint_never_completed_is_ignored(self):
        out = self.two_checkpoints("unfinished")
        (out / "checkpoint-4" / "manifest.json").unlink()  # as a save cut short would leave it
        self.assertEqual(resolve_resume("latest", out), out / "checkpoint-2")

    def test_non_finite_weights_that_verify_are_refused_on_load(self):
        out = self.two_checkpoints("nan")
        folder = out / "checkpoint-4"
        tensors = {k: v.clone() for k, v in self.run.network.state_dict().items()}
        tensors["weight"][0, 0] = float("nan")
        save_file(tensors, str(folder / FULL_WEIGHTS))  # as an older writer could have saved it
        (folder / "manifest.json").unlink()
        write_manifest(folder)
        self.assertEqual(resolve_resume("latest", out), folder)
        with self.assertRaises(RankFailure) as caught:
            self.run.load(folder)
        self.assertIn(str(folder / FULL_WEIGHTS), str(caught.exception))
        self.assertIn("'weight'", str(caught.exception))

    def test_a_damaged_file_read_directly_names_the_file(self):
        out = self.two_checkpoints("direct")
        damaged = truncate(out / "checkpoint-4")
        with self.assertRaises(CheckpointError) as caught:
            load_weights(self.run.network, out / "checkpoint-4", lora=False)
        self.assertIn(str(damaged), str(caught.exception))

    def test_an_intact_checkpoint_round_trips(self):
        out = self.two_checkpoints("intact")
        expected = self.run.network.weight.detach().clone()
        with torch.no_grad():
            self.run.network.weight.zero_()
        state, sampler = self.run.load(resolve_resume("latest", out))
        self.assertEqual((state.step, sampler), (4, {"step": 4}))
        self.assertTrue(torch.equal(self.run.network.weight, expected))


class SaveTest(unittest.TestCase):
    def setUp(self):
        self.out = Path(tempfile.mkdtemp(prefix="st-ckpt-save-"))
        self.run = SmallRun()

    def tearDown(self):
        shutil.rmtree(self.out, ignore_errors=True)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.out.iterdir())

    def test_non_finite_tensors_are_never_saved(self):
        poison = {  # the name each tensor is saved under -> the tensor
            "weight": lambda: self.run.network.weight,
            "state/0/exp_avg": lambda: self.run.optimizer.state[self.run.network.weight]["exp_avg"],
            "bias": lambda: self.run.ema.shadow["bias"]}
        for tensor_name, tensor in poison.items():
            with self.subTest(tensor_name):
                self.run = SmallRun()
                with torch.no_grad():
                    tensor().view(-1)[0] = float("inf")
                with self.assertRaises(RankFailure) as caught:
                    self.run.save(self.out, 6)
                self.assertIn("step 6", str(caught.exception))
                self.assertIn(f"'{tensor_name}'", str(caught.exception))
                self.assertEqual(self.names(), [])

    def test_pruning_keeps_the_checkpoint_just_saved_and_the_one_resumed_from(self):
        resumed_from = self.run.save(self.out, 2)
        for step in (4, 6):
            self.run.save(self.out, step, limit=1, resumed_from=resumed_from)
        self.assertEqual(self.names(), ["checkpoint-2", "checkpoint-6"])
        self.run.save(self.out, 8, limit=0)
        self.assertEqual(self.names(), ["checkpoint-8"])

    def test_saving_a_step_again_replaces_it_completely(self):
        self.run.save(self.out, 4)
        truncate(self.out / "checkpoint-4")
        self.run.save(self.out, 4)
        verify_checkpoint(self.out / "checkpoint-4")
        self.assertEqual(self.names(), ["checkpoint-4"])


class FullDiskTest(unittest.TestCase):
    """A real ENOSPC: output_dir on a 64 KB tmpfs (needs root and mount)."""

    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="st-ckpt-full-"))
        self.addCleanup(shutil.rmtree, self.root)
        self.out = self.root / "out"
        self.out.mkdir()
        mounted = run_bounded(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", self.out],
                              tmpdir=self.root, timeout=30)
        if mounted.returncode != 0:
            self.skipTest(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
        self.addCleanup(self.unmount)

    def unmount(self):
        unmounted = run_bounded(["umount", self.out], tmpdir=self.root, timeout=30)
        self.assertEqual(unmounted.returncode, 0, unmounted.stderr)

    def test_a_full_disk_leaves_no_staging_folder_and_one_line_naming_the_file(self):
        with self.assertRaises(RankFailure) as caught:
            SmallRun(features=256).save(self.out, 2)
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        self.assertIn(str(self.out / ".incomplete-checkpoint-2" / FULL_WEIGHTS), message)
        self.assertIn("No space left on device", message)
        self.assertEqual(list(self.out.iterdir()), [])


def run_fault(out: Path, fault_rank: int, limit: int, processes: int
              ) -> subprocess.CompletedProcess:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node", str(processes)] if processes > 1 else [sys.executable])
    env = dict(os.environ,
               PYTHONPATH=str(TESTS.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return run_bounded(launcher + [RUNNER, out, str(fault_rank), str(limit)],
                       tmpdir=out.parent, env=env, timeout=180)


def rank_lines(result: subprocess.CompletedProcess) -> dict[str, str]:
    return dict(line.split("] ", 1) for line in result.stdout.splitlines()
                if line.startswith("[rank "))


class FailedSaveTest(unittest.TestCase):
    """Real EFBIG (RLIMIT_FSIZE, no privileges needed) on one rank of a real run."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-ckpt-fault-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def assert_failed_cleanly(self, out: Path, lines: dict[str, str], expected_file: str):
        messages = set(lines.values())
        self.assertEqual(len(messages), 1, lines)
        message = messages.pop()
        self.assertTrue(message.startswith("failed: checkpoint at step 4 failed"), message)
        self.assertIn(str(out / ".incomplete-checkpoint-4" / expected_file), message)
        self.assertIn("File too large", message)
        self.assertEqual(sorted(p.name for p in out.iterdir()), ["checkpoint-2"])
        verify_checkpoint(out / "checkpoint-2")

    def test_a_file_size_limit_fails_the_save_naming_the_file(self):
        out = self.tmp / "single"
        result = run_fault(out, fault_rank=0, limit=100_000, processes=1)
        self.assertEqual(result.returncode, 1, result.stderr[-3000:])
        self.assert_failed_cleanly(out, rank_lines(result), FULL_WEIGHTS)

    def test_a_write_failing_on_one_rank_of_two_stops_both_with_the_same_error(self):
        for fault_rank, limit, expected_file in ((0, 100_000, FULL_WEIGHTS),
                                                 (1, 100, "rng-1.json")):
            with self.subTest(fault_rank=fault_rank):
                out = self.tmp / f"rank-{fault_rank}"
                result = run_fault(out, fault_rank, limit, processes=2)
                self.assertNotEqual(result.returncode, 0)
                lines = rank_lines(result)
                self.assertEqual(sorted(lines), ["[rank 0", "[rank 1"],
                                 f"stdout:\n{result.stdout[-3000:]}\nstderr:\n"
                                 f"{result.stderr[-6000:]}")
                self.assert_failed_cleanly(out, lines, expected_file)


if __name__ == "__main__":
    unittest.main()
