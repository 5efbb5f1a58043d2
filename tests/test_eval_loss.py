"""Evaluation loss: logged every eval_steps_interval (events.jsonl's eval lines), identical when
the run is repeated, and a run resumed with evaluation on ends exactly as the uninterrupted run
(and evaluates the same); a run killed after logging past its last checkpoint and resumed in the
same output_dir logs every evaluation once."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import tempfile
import unittest
from pathlib import Path

from safetensors.torch import load_file

from launching import run_bounded
from training_fixtures import (environment, make_shapes, read_events, run_in_process_logged,
                               run_training, write_config)

LAUNCHER = Path(__file__).resolve().parent / "fault_launcher.py"

OPTIONS = dict(max_train_steps=6, checkpointing_steps=4, eval_steps_interval=2)


def datasets(root: Path) -> list[dict]:
    return [{"id": "shapes", "instance_data_dir": str(root / "data")},
            {"id": "held-out", "dataset_type": "eval", "instance_data_dir": str(root / "eval")}]


class EvalLossTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-eval-")
        root = cls.root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        make_shapes(root / "eval", per_size=2)
        cls.runs = {}
        # "full" through the trainer's entry point (its console is checked); the runs compared
        # with it in this process: what a run logs, not how it is launched.
        for name, launch in (("full", run_training), ("again", run_in_process_logged)):
            config = write_config(root, root / "data", name, datasets=datasets(root), **OPTIONS)
            cls.runs[name] = launch(config, cls.tmp)
        if cls.runs["full"].returncode == 0:
            (root / "resumed-out").mkdir()
            shutil.copytree(root / "full-out" / "checkpoint-4",
                            root / "resumed-out" / "checkpoint-4")
            config = write_config(root, root / "data", "resumed", datasets=datasets(root),
                                  resume_from_checkpoint="latest", **OPTIONS)
            cls.runs["resumed"] = run_in_process_logged(config, cls.tmp)
            cls.crash_and_resume()

    @classmethod
    def crash_and_resume(cls):
        """Checkpointing every 3 steps, killed as the step-4 evaluation's line is written (after
        checkpoint-3), then resumed ('latest': checkpoint-3) with the same config
        in the same output_dir. (The last step is always a checkpoint, so the kill comes before
        it.)"""
        root = cls.root
        config = write_config(root, root / "data", "crashed", datasets=datasets(root),
                              resume_from_checkpoint="latest",
                              **{**OPTIONS, "checkpointing_steps": 3})
        (root / "status").mkdir()
        cls.killed = run_bounded(
            [sys.executable, str(LAUNCHER), str(root / "status"), "--fault",
             "simpletuner.training.reporting.events:EventLog.eval", "--killed-after", "2",
             "train", "--config", str(config)],
            tmpdir=cls.tmp, timeout=300, env=environment(cls.tmp))
        log = root / "crashed-out" / "events.jsonl"
        cls.killed_lines = read_events(log.parent, "eval") if log.is_file() else []
        cls.killed_checkpoints = sorted(  # before the resumed run adds its own
            p.name for p in (root / "crashed-out").glob("checkpoint-*"))
        cls.runs["after-crash"] = run_in_process_logged(config, cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def evaluations(self, name: str) -> dict[int, float]:
        result = self.runs[name]
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        return {e["step"]: e["eval_loss"] for e in read_events(self.root / f"{name}-out", "eval")}

    def test_logged_at_the_interval_and_identical_when_repeated(self):
        full = self.evaluations("full")
        self.assertEqual(sorted(full), [2, 4, 6])
        self.assertEqual(full, self.evaluations("again"))
        self.assertEqual(len(set(full.values())), 3)  # the weights change between evaluations

    def test_each_checkpoint_is_logged_once_and_the_end_in_one_line(self):
        stderr = self.runs["full"].stderr
        self.assertEqual(stderr.count("checkpoint-4"), 1, stderr[-3000:])
        self.assertRegex(stderr, r"done: 6 steps, final loss \d+\.\d{4}, seed 7; exported the "
                                 r"trained pipeline to \S+pipeline\n")

    def test_log_lines_during_training_never_join_the_progress_bar(self):
        stderr = self.runs["full"].stderr
        self.assertIn("steps:", stderr)
        # Every log line starts a line of its own: tqdm clears the bar and returns the carriage
        # (\r) before writing it; the launch keeps the \r that text mode used to turn into \n.
        glued = re.findall(r"[^\n\r]\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:INFO|WARNING)", stderr)
        self.assertEqual(glued, [], stderr[-3000:])

    def test_the_killed_run_logged_past_its_last_checkpoint(self):
        self.assertEqual(self.killed.returncode, -signal.SIGKILL, self.killed.stderr[-3000:])
        self.assertEqual([line["step"] for line in self.killed_lines], [2, 4])
        self.assertEqual(self.killed_checkpoints, ["checkpoint-3"])

    def test_resumed_after_a_crash_each_step_is_logged_once_with_the_uninterrupted_value(self):
        result = self.runs["after-crash"]
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn(f"resumed from {self.root / 'crashed-out' / 'checkpoint-3'} at step 3",
                      result.stderr)
        logged = [(line["step"], line["eval_loss"]) for line in
                  read_events(self.root / "crashed-out", "eval")]
        self.assertEqual(logged, sorted(self.evaluations("full").items()))

    def test_resume_with_eval_on_equals_the_uninterrupted_run(self):
        resumed = self.evaluations("resumed")
        self.assertEqual(resumed, {6: self.evaluations("full")[6]})
        ends = [load_file(str(self.root / f"{name}-out" / "pipeline" / "unet" /
                              "diffusion_pytorch_model.safetensors"))
                for name in ("full", "resumed")]
        worst = max((ends[0][k] - ends[1][k]).abs().max().item() for k in ends[0])
        self.assertLessEqual(worst, 1e-6)


if __name__ == "__main__":
    unittest.main()
