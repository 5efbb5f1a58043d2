"""The trainer's entry point with SimpleTuner's dataset scheduling and prior preservation (tiny
sd1x LoRA): a regularisation dataset, a subject dataset drawn with probability 0.2, and a
dataset that starts at step 5; then a run resumed from the checkpoint of step 5, whose samples
and losses must be the uninterrupted run's."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from training_fixtures import make_shapes, read_jsonl, run_training, write_config

START_STEP = 5


def step_losses(output_dir: Path) -> dict[int, float]:
    """train/loss per optimizer step, from the run's tensorboard events."""
    (folder,) = {p.parent for p in (output_dir / "logs").rglob("events.out.tfevents.*")}
    events = EventAccumulator(str(folder))
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/loss")}


def step_datasets(trace: list[dict]) -> dict[int, str]:
    """The dataset of each optimizer step (1-based; one micro-batch per step here)."""
    return {i + 1: record["dataset"] for i, record in enumerate(trace)}


def run_then_resume(case: type, data_dir: Path, options: dict, step: int) -> None:
    """For setUpClass: a run in case.tmp (case.full, output case.full_out), then a run in
    case.resumed_out from a copy of its checkpoint of ``step`` (case.resumed; None if the first
    failed)."""
    root = Path(case.tmp)
    case.full = run_training(write_config(root, data_dir, "full", **options), case.tmp)
    case.full_out, case.resumed_out = root / "full-out", root / "resumed-out"
    case.resumed = None
    if case.full.returncode == 0:
        case.resumed_out.mkdir()
        shutil.copytree(case.full_out / f"checkpoint-{step}",
                        case.resumed_out / f"checkpoint-{step}")
        case.resumed = run_training(write_config(
            root, data_dir, "resumed", resume_from_checkpoint="latest", **options), case.tmp)


class ScheduledRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-schedule-")
        root = Path(cls.tmp)
        for name, size in (("subject", (64, 64)), ("reg", (64, 64)), ("late", (96, 64))):
            make_shapes(root / name, per_size=8 if name != "late" else 4, sizes=(size,))
        datasets = [
            {"id": "subject", "instance_data_dir": str(root / "subject"), "probability": 0.2},
            {"id": "reg", "instance_data_dir": str(root / "reg"), "is_regularisation_data": True},
            {"id": "late", "instance_data_dir": str(root / "late"), "start_step": START_STEP},
        ]
        options = dict(datasets=datasets, model_type="lora", lora_rank=4, max_train_steps=10,
                       checkpointing_steps=5, trace_samples=True, report_to="tensorboard")
        run_then_resume(cls, root / "subject", options, 5)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-3000:])
        self.trace = read_jsonl(self.full_out / "trace" / "rank-0.jsonl")
        self.datasets = step_datasets(self.trace)
        self.losses = step_losses(self.full_out)

    def test_regularisation_loss_is_against_the_base_models_prediction(self):
        """Until a subject or late step moves the LoRA (B starts at 0), the adapted network is
        the base model, so SimpleTuner's regularisation loss, weight 1 times the mean squared
        distance to the base model's prediction, is exactly 0; against the noise it would be
        about 1, like the other steps. After them it is small but not 0."""
        first_other = min(s for s, d in self.datasets.items() if d != "reg")
        early = [s for s, d in self.datasets.items() if d == "reg" and s < first_other]
        later = [s for s, d in self.datasets.items() if d == "reg" and s > first_other]
        self.assertTrue(early and later, self.datasets)
        for step in early:
            self.assertEqual(self.losses[step], 0.0, step)
        others = [self.losses[s] for s, d in self.datasets.items() if d != "reg"]
        self.assertGreater(min(others), 0.3)
        for step in later:
            self.assertGreater(self.losses[step], 0.0)
            self.assertLess(self.losses[step], 0.1 * min(others))

    def test_the_late_dataset_joins_at_its_start_step_with_its_whole_pass(self):
        late = [s for s, d in self.datasets.items() if d == "late"]
        self.assertEqual(len(late), 2)  # 4 images, batch 2: its whole pass in epoch 0
        self.assertGreaterEqual(min(late), START_STEP)
        counted = {d: sum(len(r["samples"]) for r in self.trace if r["dataset"] == d)
                   for d in ("subject", "reg", "late")}
        self.assertEqual(counted, {"subject": 8, "reg": 8, "late": 4})

    def test_resume_continues_with_the_same_samples_and_losses(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        # the resumed run's trace starts at the checkpoint's position
        self.assertEqual(read_jsonl(self.resumed_out / "trace" / "rank-0.jsonl"),
                         self.trace[5:])
        resumed = step_losses(self.resumed_out)
        self.assertEqual(sorted(resumed), list(range(6, 11)))
        for step, loss in resumed.items():
            self.assertAlmostEqual(loss, self.losses[step], places=5)
        self.assertNotIn("Resuming with different data settings", self.resumed.stderr)


class NeverJoinsTest(unittest.TestCase):
    def test_a_start_after_the_last_epoch_stops_before_the_model_loads(self):
        """num_train_epochs 2 of 4 steps each: start_step 20 is only known to be too late from
        the bucket sizes, so the run stops after start-up, with status 2 and the reason."""
        with tempfile.TemporaryDirectory(prefix="st-never-") as tmp:
            root = Path(tmp)
            make_shapes(root / "a", per_size=8, sizes=((64, 64),))
            make_shapes(root / "b", per_size=4, sizes=((64, 64),))
            config = write_config(root, root / "a", max_train_steps=None, num_train_epochs=2,
                                  datasets=[
                {"id": "a", "instance_data_dir": str(root / "a")},
                {"id": "b", "instance_data_dir": str(root / "b"), "start_step": 20}])
            result = run_training(config, tmp)
            self.assertEqual(result.returncode, 2, result.stderr[-3000:])
            self.assertIn("dataset 'b': start_epoch 1, start_step 20 come after the last of the "
                          "8 optimizer steps", result.stderr)
            self.assertNotIn("Traceback", result.stderr)
            self.assertFalse((root / "config-out" / "cache" / "vae").exists())


if __name__ == "__main__":
    unittest.main()
