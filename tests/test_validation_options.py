"""Validation and schedule options with SimpleTuner's names: validation_guidance (alias),
validation_negative_prompt, validation_on_startup, validation_resolution's default, lr_end,
lr_power, lr_num_cycles."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace

import torch
from huggingface_hub import ModelCard
from PIL import Image

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.pipelines import generate_validation_images
from simpletuner.training.optimization.schedules import build_lr_scheduler
from simpletuner.training.settings import ScheduleSettings
from launching import REPO, run_bounded
from settings_fixtures import settings
from training_fixtures import environment, make_shapes, write_config


class ValidationConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "data").mkdir()

    def load(self, **options):
        config = write_config(self.root, self.root / "data", **options)
        values = json.loads(config.read_text())
        values.pop("validation_resolution")
        values.update(options)
        config.write_text(json.dumps(values))
        return load_configuration(config).training

    def test_validation_guidance_is_simpletuners_name_for_the_guidance_scale(self):
        self.assertEqual(self.load(validation_guidance=3.0).validation_guidance_scale, 3.0)
        with self.assertRaises(ConfigError) as caught:
            self.load(validation_guidance=3.0, validation_guidance_scale=4.0)
        self.assertIn("given twice", str(caught.exception))

    def test_validation_resolution_defaults_to_the_training_resolution(self):
        self.assertEqual(self.load(resolution=512).validation_resolution, 512)
        self.assertEqual(self.load(resolution=1.0, resolution_type="area",
                                   aspect_bucket_alignment=64).validation_resolution, 1024)
        self.assertEqual(self.load(resolution=768, resolution_type="pixel_area")
                         .validation_resolution, 768)
        self.assertEqual(self.load(validation_resolution=128).validation_resolution, 128)

    def test_lr_end_must_be_below_the_learning_rate_for_polynomial(self):
        with self.assertRaises(ConfigError) as caught:
            self.load(lr_scheduler="polynomial", learning_rate=1e-5, lr_end=1e-4)
        self.assertIn("'lr_end' (0.0001) must be below learning_rate", str(caught.exception))


def schedule_with(**options):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_lr_scheduler(settings(ScheduleSettings, **options), optimizer,
                                   total_steps=100)

    def lr_at(step: int) -> float:
        while scheduler.last_epoch < step:
            optimizer.step()
            scheduler.step()
        return optimizer.param_groups[0]["lr"]
    return lr_at


class ScheduleOptionsTest(unittest.TestCase):
    def test_polynomial_uses_lr_end_and_lr_power(self):
        lr_at = schedule_with(lr_scheduler="polynomial", lr_power=2.0, lr_end=0.1)
        self.assertAlmostEqual(lr_at(50), (1.0 - 0.1) * 0.5 ** 2 + 0.1, places=6)
        self.assertAlmostEqual(lr_at(100), 0.1, places=6)

    def test_cosine_with_restarts_uses_lr_num_cycles(self):
        lr_at = schedule_with(lr_scheduler="cosine_with_restarts", lr_num_cycles=2)
        self.assertAlmostEqual(lr_at(25), 0.5, places=6)
        self.assertAlmostEqual(lr_at(50), 1.0, places=6)  # the second cycle starts


class RecordingPipeline:
    device = torch.device("cpu")
    components: dict = {}

    def __init__(self):
        self.calls = []

    def set_progress_bar_config(self, **_):
        pass

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return SimpleNamespace(images=[Image.new("RGB", (8, 8))])


class NegativePromptTest(unittest.TestCase):
    def test_negative_prompt_reaches_the_pipeline_only_when_given(self):
        pipeline = RecordingPipeline()
        generate_validation_images(pipeline, ["a"], resolution=8, num_inference_steps=1,
                                   negative_prompt="blurry")
        generate_validation_images(pipeline, ["a"], resolution=8, num_inference_steps=1)
        self.assertEqual(pipeline.calls[0]["negative_prompt"], "blurry")
        self.assertNotIn("negative_prompt", pipeline.calls[1])


class ValidationOptionsThroughTrainShTest(unittest.TestCase):
    def test_overrides_startup_validation_at_the_training_resolution_and_card(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=2)
            config = write_config(root, root / "data")
            values = json.loads(config.read_text())
            values.pop("validation_resolution")
            config.write_text(json.dumps(values))
            result = run_bounded(
                [REPO / "train.sh", config, "--max_train_steps", "2",
                 "--validation_prompt", "a red circle", "--validation_on_startup", "true",
                 "--validation_negative_prompt", "blurry", "--validation_guidance", "2.0",
                 "--validation_num_inference_steps", "2", "--lr_scheduler", "polynomial",
                 "--lr_end", "1e-5", "--lr_power", "2"],
                tmpdir=tmp, env=environment(tmp), timeout=300)
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
            summary = json.loads((root / "config-out" / "training_summary.json").read_text())
            self.assertEqual(summary["steps"], 2)  # the command line's, not the file's 4
            card = ModelCard.load(root / "config-out" / "pipeline" / "README.md")
            self.assertEqual(card.data.library_name, "diffusers")
            self.assertIn("| steps | 2 |", card.text)
            out = root / "config-out" / "validation"
            self.assertEqual(sorted(p.name for p in out.iterdir()), ["step-0", "step-2"])
            with Image.open(next((out / "step-0").glob("*.png"))) as image:
                self.assertEqual(image.size, (64, 64))  # the training resolution, not 1024


if __name__ == "__main__":
    unittest.main()
