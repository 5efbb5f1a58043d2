"""Bad input is reported before any heavy work, every problem at once, with what to do."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.training.checkpointing.checkpointer import RUN_STATE
from simpletuner.training.checkpointing.folders import complete_checkpoints, resolve_resume
from simpletuner.training.checkpointing.manifest import write_manifest
from simpletuner.training.preflight import run_preflight

from training_fixtures import make_shapes, run_training, write_config


class PreflightTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-preflight-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=4)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def problems(self, **options) -> list[str]:
        config = write_config(self.root, self.root / "data", "case", **options)
        with self.assertRaises(ConfigError) as caught:
            run_preflight(load_configuration(config))
        return caught.exception.problems

    def assertOneProblem(self, fragment: str, **options) -> str:
        problems = self.problems(**options)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn(fragment, problems[0])
        return problems[0]

    def test_a_valid_config_passes_and_names_the_model_folder(self):
        config = write_config(self.root, self.root / "data", "valid")
        preflight = run_preflight(load_configuration(config))
        self.assertTrue((preflight.model_folder / "unet").is_dir())
        self.assertIsNone(preflight.resume_from)
        self.assertEqual(preflight.seed, 7)

    def test_missing_model_folder(self):
        message = self.assertOneProblem(
            "is not a local folder", pretrained_model_name_or_path=str(self.root / "nowhere"))
        self.assertIn("pretrained_model_name_or_path", message)
        self.assertIn("builtin:tiny-sd1x", message)  # says what would work

    def test_folder_of_another_family(self):
        message = self.assertOneProblem("is not a sd1x model folder",
                                        pretrained_model_name_or_path="builtin:tiny-sdxl")
        self.assertIn("set model_family to match", message)

    def test_unknown_builtin_lists_the_known_ones(self):
        message = self.assertOneProblem("unknown built-in model 'builtin:tiny-sd9'",
                                        pretrained_model_name_or_path="builtin:tiny-sd9")
        self.assertIn("builtin:tiny-sdxl", message)

    def test_validation_resolution_off_the_alignment(self):
        self.assertOneProblem("multiple of aspect_bucket_alignment (16)",
                              validation_resolution=72)

    def test_output_dir_not_writable(self):
        blocker = self.root / "a-file"
        blocker.write_text("not a folder")
        self.assertOneProblem("is not writable", output_dir=str(blocker / "out"))

    def test_fp16_without_cuda(self):
        self.assertOneProblem("needs a CUDA device", mixed_precision="fp16")

    def test_no_length_given(self):
        self.assertOneProblem("set 'max_train_steps' or 'num_train_epochs'",
                              max_train_steps=None)

    def test_resume_from_a_folder_that_is_not_a_checkpoint(self):
        self.assertOneProblem("is not a usable checkpoint",
                              resume_from_checkpoint=str(self.root / "data"))

    def test_several_problems_are_reported_together(self):
        problems = self.problems(validation_resolution=72,
                                 pretrained_model_name_or_path="builtin:nope",
                                 max_train_steps=None)
        self.assertEqual(len(problems), 3, problems)

    def test_unknown_scheduler_and_optimizer_names_are_config_errors(self):
        config = write_config(self.root, self.root / "data", "names", lr_scheduler="cosin",
                              optimizer="adam8bit")
        with self.assertRaises(ConfigError) as caught:
            load_configuration(config)
        text = str(caught.exception)
        self.assertIn("'lr_scheduler' is 'cosin'", text)
        self.assertIn("did you mean 'cosine'?", text)
        self.assertIn("'optimizer' is 'adam8bit'", text)


class LatestCheckpointTest(unittest.TestCase):
    def test_an_interrupted_save_is_never_taken_for_a_checkpoint(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            for step in (4, 8):
                (out / f"checkpoint-{step}").mkdir()
                (out / f"checkpoint-{step}" / RUN_STATE).write_text(json.dumps({"step": step}))
                write_manifest(out / f"checkpoint-{step}")
            # A save interrupted before its rename, and a folder without the manifest.
            (out / ".incomplete-checkpoint-12").mkdir()
            (out / "checkpoint-16").mkdir()
            (out / "checkpoint-16" / "model.safetensors").write_bytes(b"partial")
            self.assertEqual([s for s, _ in complete_checkpoints(out)], [4, 8])
            self.assertEqual(resolve_resume("latest", out), out / "checkpoint-8")
            with self.assertRaises(ValueError):
                resolve_resume(str(out / "checkpoint-16"), out)

    def test_latest_without_checkpoints_starts_fresh(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertIsNone(resolve_resume("latest", Path(tmp)))


class EntryPointErrorTest(unittest.TestCase):
    def test_bad_config_exits_2_with_every_problem_before_any_work(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=4)
            config = write_config(root, root / "data", "bad", train_bach_size=2,
                                  validation_resolution=72)
            result = run_training(config, tmp, timeout=120)
            self.assertEqual(result.returncode, 2, result.stderr[-2000:])
            self.assertIn("did you mean 'train_batch_size'?", result.stderr)
            self.assertNotIn("Traceback", result.stderr)
            self.assertFalse((root / "bad-out" / "cache").exists())


if __name__ == "__main__":
    unittest.main()
