"""output_dir/events.jsonl: a real tiny run (in process, with evaluation, validation, a
skipped file and checkpoints) writes its start, every step, evaluation, validation and
checkpoint and its end, in order; a run SIGKILLed after writing steps past its last checkpoint
and resumed in the same output_dir leaves each step in the file once, in order; the writer
alone: a torn line cut away, a failed write a warning, nothing from another rank."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import unittest
from pathlib import Path

from accelerate import Accelerator

from launching import run_bounded
from simpletuner.configuration import load_configuration
from simpletuner.training.recipe import Trainer
from simpletuner.training.reporting.events import EventLog
from training_fixtures import (environment, make_shapes, read_events, read_jsonl,
                               run_in_process_logged, write_config)

LAUNCHER = Path(__file__).resolve().parent / "fault_launcher.py"
PROMPT = "a red circle on a blue background"


def datasets(root: Path) -> list[dict]:
    return [{"id": "shapes", "instance_data_dir": str(root / "data"),
             "caption_strategy": "textfile"},
            {"id": "held-out", "dataset_type": "eval", "instance_data_dir": str(root / "eval"),
             "caption_strategy": "textfile"}]


def make_data(root: Path) -> None:
    make_shapes(root / "data", per_size=4)
    (root / "data" / "broken.png").write_bytes(b"not an image at all")
    make_shapes(root / "eval", per_size=1)


def types_and_steps(output_dir: Path) -> list[tuple[str, int]]:
    return [(event["type"], event["step"]) for event in read_jsonl(output_dir / "events.jsonl")]


class EventLogWriterTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def test_a_resume_keeps_the_whole_lines_up_to_its_step(self):
        first = EventLog(self.out, main=True)
        first.open(0)
        for step in (1, 2, 3):
            first.step(step, loss=0.5, lr=1e-4, skipped=False)
        with open(self.out / "events.jsonl", "a") as log:
            log.write('{"type": "step", "step": 4, "lo')  # torn by a kill
        EventLog(self.out, main=True).open(2)
        self.assertEqual(types_and_steps(self.out), [("step", 1), ("step", 2)])
        EventLog(self.out, main=True).open(5)
        self.assertEqual(types_and_steps(self.out), [("step", 1), ("step", 2)])

    def test_a_non_finite_loss_is_null(self):
        log = EventLog(self.out, main=True)
        log.open(0)
        log.step(1, loss=float("nan"), lr=1e-4, skipped=True)
        (step,) = read_events(self.out, "step")
        self.assertEqual((step["loss"], step["skipped"]), (None, True))

    def test_a_failed_write_is_a_warning_and_ends_the_log(self):
        (self.out / "events.jsonl").mkdir()
        log = EventLog(self.out, main=True)
        log.open(0)
        with self.assertLogs("simpletuner.training.reporting.events", "WARNING") as logged:
            log.step(1, loss=0.5, lr=1e-4, skipped=False)
        self.assertIn("could not write", logged.output[0])
        self.assertFalse(log.writing)

    def test_another_rank_and_an_unopened_log_write_nothing(self):
        other = EventLog(self.out, main=False)
        other.open(0)
        other.step(1, loss=0.5, lr=1e-4, skipped=False)
        EventLog(self.out, main=True).end(0, status="failed", exit_status=1)
        self.assertEqual(list(self.out.iterdir()), [])


class EventsOfOneRunTest(unittest.TestCase):
    """Six steps: evaluation every 2, validation at 3 and 6, checkpoints at 4 and 6 (the last
    step is always saved)."""

    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="st-events-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        make_data(cls.root)
        config = write_config(cls.root, cls.root / "data", "run", datasets=datasets(cls.root),
                              max_train_steps=6, checkpointing_steps=4, eval_steps_interval=2,
                              validation_steps=3, validation_prompt=[PROMPT],
                              validation_num_inference_steps=2)
        cls.out = cls.root / "run-out"
        Trainer(load_configuration(config), Accelerator(cpu=True)).run()

    def test_every_event_in_the_order_the_run_made_it(self):
        self.assertEqual(types_and_steps(self.out), [
            ("start", 0), ("status", 0), ("skip", 0),
            ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("validation", 3),
            ("step", 4), ("checkpoint", 4), ("eval", 4), ("step", 5),
            ("step", 6), ("checkpoint", 6), ("validation", 6), ("eval", 6), ("end", 6)])

    def test_every_line_has_a_wall_clock_time_in_order(self):
        times = [event["time"] for event in read_jsonl(self.out / "events.jsonl")]
        self.assertTrue(all(isinstance(t, float) and t > 1.7e9 for t in times), times)
        self.assertEqual(times, sorted(times))

    def test_start_status_and_end(self):
        (start,), (status,), (end,) = (read_events(self.out, kind)
                                       for kind in ("start", "status", "end"))
        self.assertEqual((start["resumed_from"], start["world_size"], start["max_steps"]),
                         (None, 1, 6))
        self.assertEqual((start["settings"]["model_family"], start["settings"]["seed"]),
                         ("sd1x", 7))
        self.assertEqual(status["status"], "running")
        self.assertEqual((end["status"], end["exit_status"]), ("finished", 0))

    def test_steps_carry_loss_lr_and_elapsed(self):
        steps = read_events(self.out, "step")
        self.assertTrue(all(0 < s["loss"] < 10 and s["lr"] == 1e-3 and s["skipped"] is False
                            for s in steps), steps)
        elapsed = [s["elapsed"] for s in steps]
        self.assertEqual(elapsed, sorted(elapsed))

    def test_evaluations_validations_and_checkpoints_name_what_was_written(self):
        self.assertTrue(all(0 < e["eval_loss"] < 10 for e in read_events(self.out, "eval")))
        validations = read_events(self.out, "validation")
        self.assertEqual([v["files"] for v in validations], [
            ["validation/step-3/image-00.png", "validation/step-3/grid.png"],
            ["validation/step-6/image-00.png", "validation/step-6/grid.png"]])
        self.assertTrue(all((self.out / name).is_file()
                            for validation in validations for name in validation["files"]))
        self.assertEqual([c["folder"] for c in read_events(self.out, "checkpoint")],
                         ["checkpoint-4", "checkpoint-6"])

    def test_the_skipped_file_is_counted_and_named(self):
        (skip,) = read_events(self.out, "skip")
        self.assertEqual((skip["count"], skip["by_dataset"], skip["file"]),
                         (1, {"shapes": 1}, "skipped_files.json"))
        self.assertEqual([(s["dataset"], Path(s["path"]).name) for s in skip["first"]],
                         [("shapes", "broken.png")])

    def test_the_old_step_and_eval_logs_are_not_written(self):
        self.assertFalse((self.out / "training_steps.jsonl").exists())
        self.assertFalse((self.out / "eval_loss.jsonl").exists())


class KilledThenResumedTest(unittest.TestCase):
    """Six steps, a checkpoint every 3 and evaluation every 2: SIGKILLed as step 5's line is
    written (after checkpoint-3, step 4's evaluation), then run again with 'latest'."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-events-killed-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        root = Path(cls.tmp)
        make_data(root)
        config = write_config(root, root / "data", "killed", datasets=datasets(root),
                              max_train_steps=6, checkpointing_steps=3, eval_steps_interval=2,
                              resume_from_checkpoint="latest")
        cls.out = root / "killed-out"
        (root / "status").mkdir()
        cls.killed = run_bounded(
            [sys.executable, str(LAUNCHER), str(root / "status"), "--fault",
             "simpletuner.training.reporting.events:EventLog.step", "--killed-after", "5",
             "train", "--config", str(config)],
            tmpdir=cls.tmp, timeout=300, env=environment(cls.tmp))
        events = cls.out / "events.jsonl"
        cls.killed_events = types_and_steps(cls.out) if events.is_file() else []
        cls.resumed = run_in_process_logged(config, cls.tmp)  # what it logs, in this process

    def test_the_killed_run_wrote_steps_past_its_last_checkpoint(self):
        self.assertEqual(self.killed.returncode, -signal.SIGKILL, self.killed.stderr[-3000:])
        self.assertEqual(self.killed_events, [
            ("start", 0), ("status", 0), ("skip", 0), ("step", 1), ("step", 2), ("eval", 2),
            ("step", 3), ("checkpoint", 3), ("step", 4), ("eval", 4), ("step", 5)])

    def test_after_the_resume_each_step_is_in_the_file_once_in_order(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertEqual(types_and_steps(self.out), [
            ("start", 0), ("status", 0), ("skip", 0), ("step", 1), ("step", 2), ("eval", 2),
            ("step", 3), ("checkpoint", 3),
            ("start", 3), ("status", 3), ("skip", 3), ("step", 4), ("eval", 4), ("step", 5),
            ("step", 6), ("checkpoint", 6), ("eval", 6), ("end", 6)])
        self.assertEqual([s["resumed_from"] for s in read_events(self.out, "start")], [None, 3])


if __name__ == "__main__":
    unittest.main()
