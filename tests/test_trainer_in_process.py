"""The trainer driven in-process on the tiny SD 1.x model: set-up leaves explicit state, one
``train_step`` is one optimizer step over ``accumulation`` micro-batches, a non-finite step is
skipped and recorded in the run state, and a checkpoint resumed by a second trainer continues
with the first one's weights, schedule, guard and sampler position."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import unittest
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import torch
from accelerate import Accelerator

from simpletuner.configuration import load_configuration
from simpletuner.helpers.multiaspect.prefetch import PrefetchedBatches
from simpletuner.training.recipe import Trainer
from simpletuner.training.run.leftovers import leftovers
from simpletuner.training.run.outcomes import Preempted
from simpletuner.training.run.requests import request
from training_fixtures import make_shapes, read_events, write_config


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.parts.network.state_dict().items()}


def micro_batches(trainer: Trainer):
    return closing(iter(PrefetchedBatches(trainer.sampler, trainer.caches.assembler)))


class TrainerCase(unittest.TestCase):
    """A dataset of eight 64 px shapes and trainers over it, each with an output_dir of its own."""

    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="st-trainer-"))
        cls.data = cls.root / "data"
        make_shapes(cls.data, per_size=8, sizes=((64, 64),))
        cls.accelerator = Accelerator(cpu=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)

    def trainer(self, name: str, **options) -> Trainer:
        settings = {"gradient_accumulation_steps": 2, "max_train_steps": 6,
                    "lr_scheduler": "linear", "use_ema": True, **options}
        config = write_config(self.root, self.data, name=name, **settings)
        trainer = Trainer(load_configuration(config), self.accelerator)
        trainer.set_up()
        return trainer


class TrainerInProcessTest(TrainerCase):
    def test_set_up_resolves_the_seed_without_writing_it_into_the_configuration(self):
        trainer = self.trainer("unseeded", seed=None)
        self.assertIsNone(trainer.configuration.training.seed)
        self.assertIsInstance(trainer.state.seed, int)
        self.assertEqual(trainer.state.seed, trainer.sampler.seed)
        self.assertEqual((trainer.state.step, trainer.state.final_loss), (0, None))
        self.assertEqual(trainer.total_steps, 6)

    def test_one_train_step_is_one_optimizer_step_over_the_accumulated_micro_batches(self):
        trainer = self.trainer("one-step")
        before = weights(trainer)
        with micro_batches(trainer) as batches:
            totals = trainer.train_step(batches)
        self.assertEqual((trainer.sampler.epoch, trainer.sampler.step), (0, 2))
        self.assertEqual(totals.micro_batches, 2)
        self.assertEqual(trainer.state.step, 1)
        self.assertEqual(trainer.state.final_loss, totals.mean_loss)
        self.assertTrue(torch.isfinite(torch.tensor(totals.mean_loss)))
        self.assertEqual(trainer.parts.lr_scheduler.last_epoch, 1)
        after = weights(trainer)
        self.assertTrue(any(not torch.equal(before[k], after[k]) for k in before))

    def test_a_non_finite_batch_is_skipped_and_recorded_in_the_run_state(self):
        trainer = self.trainer("nan")
        before = weights(trainer)
        with micro_batches(trainer) as batches:
            poisoned = ((mb, replace(batch, latents=torch.full_like(batch.latents, float("nan"))))
                        for mb, batch in batches)
            totals = trainer.train_step(poisoned)
        self.assertFalse(totals.finite)
        self.assertEqual(trainer.state.step, 1)
        self.assertEqual(trainer.state.nonfinite_steps, [1])
        self.assertIsNone(trainer.state.final_loss)
        self.assertEqual(trainer.parts.lr_scheduler.last_epoch, 0)
        after = weights(trainer)
        self.assertTrue(all(torch.equal(before[k], after[k]) for k in before))

    def test_a_resumed_trainer_continues_where_the_checkpoint_stopped(self):
        first = self.trainer("resume")
        with micro_batches(first) as batches:
            for _ in range(2):
                first.train_step(batches)
            first.checkpoint()
            first.train_step(batches)
        second = self.trainer("resume", resume_from_checkpoint="latest")
        self.assertEqual(second.state.step, 2)
        self.assertEqual((second.sampler.epoch, second.sampler.step), (0, 4))
        self.assertEqual(second.parts.lr_scheduler.last_epoch, 2)
        with micro_batches(second) as batches:
            second.train_step(batches)
        self.assertEqual(second.state.final_loss, first.state.final_loss)
        expected, resumed = weights(first), weights(second)
        for name in expected:
            torch.testing.assert_close(resumed[name], expected[name], rtol=0, atol=1e-6,
                                       msg=name)



class ResumedScheduleTest(TrainerCase):
    """A resume whose settings move the learning rate at the resumed step says so, once."""

    def checkpoint_at_step_two(self, name: str) -> None:
        first = self.trainer(name)
        with micro_batches(first) as batches:
            for _ in range(2):
                first.train_step(batches)
        first.checkpoint()

    def test_a_longer_run_warns_that_the_learning_rate_moved(self):
        self.checkpoint_at_step_two("longer")
        with self.assertLogs("simpletuner.training.recipe", "WARNING") as logs:
            self.trainer("longer", resume_from_checkpoint="latest", max_train_steps=12)
        moved = [line for line in logs.output if "resuming at step 2" in line]
        self.assertEqual(len(moved), 1, logs.output)
        # linear from 1e-3 (write_config's learning_rate): 4/6 of it at step 2 of 6, 10/12 of 12
        self.assertIn("was 0.000667", moved[0])
        self.assertIn("gives 0.000833", moved[0])

    def test_the_same_settings_resume_without_the_warning(self):
        self.checkpoint_at_step_two("same")
        with self.assertLogs("simpletuner.training.recipe", "INFO") as logs:
            self.trainer("same", resume_from_checkpoint="latest")
        self.assertTrue(any("resumed from" in line for line in logs.output), logs.output)
        self.assertFalse(any("resuming at step" in line for line in logs.output), logs.output)


class RunRequestsTest(TrainerCase):
    """A checkpoint or a validation asked for from outside (the UI's buttons: a file in
    output_dir/requests/) happens after the next step, once."""

    def test_a_checkpoint_asked_for_is_saved_after_the_next_step_once(self):
        trainer = self.trainer("asked-checkpoint", max_train_steps=3, checkpointing_steps=100,
                               use_ema=False)
        asked = request(trainer.output_dir, "checkpoint")
        trainer.train()
        self.assertEqual(sorted(p.name for p in trainer.output_dir.glob("checkpoint-*")),
                         ["checkpoint-1", "checkpoint-3"])  # asked, and the last step's
        self.assertFalse(asked.exists())

    def test_a_validation_asked_for_writes_its_images_after_the_next_step(self):
        trainer = self.trainer("asked-validation", max_train_steps=2, use_ema=False,
                               validation_prompt="a red circle",
                               validation_num_inference_steps=1, validation_steps=100)
        request(trainer.output_dir, "validate")
        trainer.train()
        self.assertEqual([event["step"] for event in read_events(trainer.output_dir,
                                                                 "validation")], [1, 2])

    def test_a_validation_asked_of_a_run_without_prompts_is_dropped_with_a_warning(self):
        trainer = self.trainer("asked-nothing", max_train_steps=1, use_ema=False)
        asked = request(trainer.output_dir, "validate")
        with self.assertLogs("simpletuner.training.recipe", "WARNING") as logs:
            trainer.train()
        self.assertIn("validates nothing (no validation_prompt)", "\n".join(logs.output))
        self.assertEqual(read_events(trainer.output_dir, "validation"), [])
        self.assertFalse(asked.exists())


class EveryOptimizerResumesTest(TrainerCase):
    """Each optimizer the trainer accepts on this machine saves, verifies and resumes to the
    uninterrupted run's weights, under a schedule that changes the rate every step."""

    # ao-adamw8bit compiles its step once per parameter shape (29 in the full UNet, minutes on
    # two cores); LoRA, what it is chosen for on 24 GB, has three. Its 8-bit states' own resume
    # is tests/test_optimizers.py's.
    OPTIMIZERS = {"adamw": {}, "adamw_bf16": {"mixed_precision": "bf16"},
                  "ao-adamw8bit": {"model_type": "lora"}, "prodigy": {"learning_rate": 1.0},
                  "adafactor": {}, "lion": {}}

    def test_every_optimizer(self):
        for name, options in self.OPTIMIZERS.items():
            with self.subTest(optimizer=name):
                self.check_resume(name, options)

    def check_resume(self, name: str, options: dict) -> None:
        settings = {"optimizer": name, "lr_scheduler": "cosine", "lr_warmup_steps": 1,
                    "max_train_steps": 4, "use_ema": False, **options}
        first = self.trainer(f"opt-{name}", **settings)
        with micro_batches(first) as batches:
            for _ in range(2):
                first.train_step(batches)
            saved = first.checkpoint()
            first.train_step(batches)
        self.assertTrue((saved / "manifest.json").is_file())
        second = self.trainer(f"opt-{name}", resume_from_checkpoint="latest", **settings)
        self.assertEqual(second.parts.lr_scheduler.get_last_lr(),
                         [float(lr) for lr in first_rates(saved)])
        with micro_batches(second) as batches:
            second.train_step(batches)
        expected, resumed = weights(first), weights(second)
        for key in expected:
            torch.testing.assert_close(resumed[key], expected[key], rtol=0, atol=1e-6,
                                       msg=f"{name}: {key}")


def first_rates(checkpoint: Path) -> list[float]:
    return json.loads((checkpoint / "lr_scheduler.json").read_text())["_last_lr"]


class SignalledDuringValidation(Trainer):
    """Receives a real SIGTERM while its validation of the last step runs."""

    def validate(self) -> None:
        if self.state.step == self.total_steps:
            os.kill(os.getpid(), signal.SIGTERM)
        super().validate()


class EndOfTrainingTest(TrainerCase):
    """The end of training is a checkpoint, a signal during the last validation is honoured,
    and a finished run resumed and exported again keeps its final loss."""

    def test_the_last_step_is_saved_whatever_checkpointing_steps_is(self):
        trainer = self.trainer("last", max_train_steps=3, checkpointing_steps=2, use_ema=False)
        trainer.train()
        out = trainer.output_dir
        self.assertEqual(sorted(p.name for p in out.glob("checkpoint-*")),
                         ["checkpoint-2", "checkpoint-3"])
        first = trainer.export()
        again = self.trainer("last", max_train_steps=3, checkpointing_steps=2, use_ema=False,
                             resume_from_checkpoint="latest")
        self.assertEqual(again.state.step, 3)
        again.train()
        self.assertEqual(again.export().final_loss, first.final_loss)
        summary = json.loads((out / "training_summary.json").read_text())
        self.assertEqual(summary["final_loss"], first.final_loss)
        self.assertIsNotNone(first.final_loss)

    def test_a_signal_during_the_last_validation_stops_as_preempted(self):
        config = write_config(self.root, self.data, name="signalled", max_train_steps=2,
                              validation_prompt="a red circle", validation_num_inference_steps=1)
        trainer = SignalledDuringValidation(load_configuration(config), self.accelerator)
        trainer.set_up()
        with self.assertRaises(Preempted) as caught:
            trainer.train()
        self.assertEqual((caught.exception.signal_name, caught.exception.step), ("SIGTERM", 2))
        self.assertEqual(caught.exception.checkpoint, trainer.output_dir / "checkpoint-2")
        self.assertTrue((trainer.output_dir / "checkpoint-2" / "manifest.json").is_file())

    def test_a_signal_in_the_middle_of_the_export_finishes_it(self):
        config = write_config(self.root, self.data, name="export-signal", max_train_steps=2,
                              use_ema=False)
        trainer = Trainer(load_configuration(config), self.accelerator)
        signaller = SignalWhileStaging(trainer.output_dir)
        signaller.start()
        with self.assertLogs("simpletuner.training.run.preemption", "WARNING") as logs:
            result = trainer.run()
        signaller.join()
        self.assertIn("SIGTERM received during the export: finishing it", logs.output[0])
        self.assertTrue(signaller.fired, "the export's staging folder was never seen")
        self.assertEqual(trainer.watcher.requested, "SIGTERM")
        for part in ("model_index.json", "README.md", "unet/diffusion_pytorch_model.safetensors"):
            self.assertTrue((result.pipeline_dir / part).is_file(), part)
        summary = json.loads((trainer.output_dir / "training_summary.json").read_text())
        self.assertEqual(summary["steps"], 2)
        self.assertEqual(leftovers(trainer.output_dir), [])


class SignalWhileStaging(threading.Thread):
    """Sends this process a real SIGTERM once the export's staging folder exists."""

    def __init__(self, output_dir: Path):
        super().__init__(daemon=True)
        self.output_dir, self.fired = output_dir, False

    def run(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.output_dir.is_dir() and any(
                    entry.name.startswith(".pipeline-") for entry in os.scandir(self.output_dir)):
                os.kill(os.getpid(), signal.SIGTERM)
                self.fired = True
                return
            time.sleep(0.0005)


if __name__ == "__main__":
    unittest.main()
