"""Every non-SD1 family through the real trainer: 6-step runs of sdxl, sd3 and flux export
pipelines diffusers loads and samples from, with validation images on the way; a Flux LoRA
run exports an adapter FluxPipeline.load_lora_weights accepts."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
from diffusers import DiffusionPipeline

from trained_outputs import TrainedOutputAssertions
from training_fixtures import environment, make_shapes, run_training, write_config

RUNS = {"sdxl": {}, "sd3": {}, "flux": {},
        "flux-lora": dict(model_type="lora", lora_rank=4, learning_rate=5e-3)}


class FamilyTrainingTest(TrainedOutputAssertions, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-families-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=2)
        cls.enterClassContext(mock.patch.dict(os.environ, environment(cls.tmp)))
        cls.results = {}
        for name, options in RUNS.items():
            family = name.split("-")[0]
            config = write_config(
                root, root / "data", name, model_family=family,
                pretrained_model_name_or_path=f"builtin:tiny-{family}", max_train_steps=6,
                train_batch_size=2, validation_prompt="a red circle on a blue background",
                validation_num_inference_steps=2, **options)
            cls.results[name] = (run_training(config, cls.tmp), root / f"{name}-out")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_full_runs_export_pipelines_diffusers_samples_from(self):
        expected = {"sdxl": "StableDiffusionXLPipeline", "sd3": "StableDiffusion3Pipeline",
                    "flux": "FluxPipeline"}
        for family, class_name in expected.items():
            with self.subTest(family=family):
                result, out = self.results[family]
                self.assertEqual(result.returncode, 0, result.stderr[-3000:])
                self.assertTrue((out / "validation" / "step-6" / "grid.png").is_file())
                pipeline = DiffusionPipeline.from_pretrained(out / "pipeline")
                self.assertEqual(type(pipeline).__name__, class_name)
                self.assertGreater(self.sample_image(pipeline).std(), 0.0)

    def test_flux_lora_export_loads_onto_the_base_pipeline(self):
        result, out = self.results["flux-lora"]
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertFalse((out / "pipeline").exists())
        from simpletuner.models.builtin import resolve_model_path

        pipeline = DiffusionPipeline.from_pretrained(resolve_model_path("builtin:tiny-flux"))
        before = self.sample_image(pipeline)
        pipeline.load_lora_weights(out / "lora")
        self.assertGreater(np.abs(self.sample_image(pipeline) - before).mean(), 0.1)


if __name__ == "__main__":
    unittest.main()
