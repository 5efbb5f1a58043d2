"""Runs that end non-finite are not "trained": a run whose last steps were skipped as
non-finite (fewer than max_nonfinite_steps, so the guard never stopped it), or that completed
no finite step, ends diverged: exit status 3, nothing exported, advice fitting the cause.
Real runs of the tiny SD 1.x model in subprocesses."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from simpletuner.models.builtin import ensure_builtin_model
from training_fixtures import make_shapes, read_events, read_report, run_training, write_config


class NonFiniteEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-nonfinite-end-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=4)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_to_the_end(self, name: str, **options):
        config = write_config(self.root, self.root / "data", name, max_train_steps=3,
                              max_nonfinite_steps=10, max_grad_norm=0, **options)
        return run_training(config, self.tmp, timeout=300), self.root / f"{name}-out"

    def assert_diverged_and_not_exported(self, result, out: Path) -> list[int]:
        self.assertEqual(result.returncode, 3, result.stderr[-3000:])
        self.assertIn("training diverged", result.stderr)
        self.assertFalse((out / "pipeline").exists())
        self.assertEqual(read_report(out).status, "diverged")
        return [r["step"] for r in read_events(out, "step") if r["skipped"]]

    def test_a_blown_up_first_step_ends_diverged_blaming_the_learning_rate(self):
        # Step 1 is finite and its update blows the weights up; steps 2 and 3 are NaN.
        result, out = self.run_to_the_end("blown-up", learning_rate=1e30)
        skipped = self.assert_diverged_and_not_exported(result, out)
        self.assertEqual(skipped, [2, 3])
        self.assertIn("The last finite step was step 1", result.stderr)
        self.assertIn("a lower learning_rate (now 1e+30)", result.stderr)

    def test_a_run_without_one_finite_step_ends_diverged_blaming_the_start(self):
        # A model whose UNet holds a NaN weight: every step's loss is NaN from the start.
        model = Path(shutil.copytree(ensure_builtin_model("tiny-sd1x"), self.root / "nan-model"))
        weights = model / "unet" / "diffusion_pytorch_model.safetensors"
        tensors = load_file(str(weights))
        name = next(k for k, v in sorted(tensors.items()) if v.is_floating_point())
        tensors[name] = torch.full_like(tensors[name], float("nan"))
        save_file(tensors, str(weights))
        result, out = self.run_to_the_end("never-finite", learning_rate=1e-4,
                                          pretrained_model_name_or_path=str(model))
        skipped = self.assert_diverged_and_not_exported(result, out)
        self.assertEqual(skipped, [1, 2, 3])
        self.assertIn("No step was finite", result.stderr)
        self.assertNotIn("learning_rate", result.stderr.splitlines()[-1])


if __name__ == "__main__":
    unittest.main()
