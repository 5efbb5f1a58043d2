"""Built-in tiny models: built locally, deterministic, race-safe, and named clearly."""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import torch
from safetensors.torch import load_file

from launching import Launch
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.builtin import (
    UnknownBuiltinError, ensure_builtin_model, resolve_model_path, run_builtin_command)


class BuiltinCacheCase(unittest.TestCase):
    """Each class gets its own empty SIMPLETUNER_CACHE."""

    @classmethod
    def setUpClass(cls):
        cls.cache = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        cls.enterClassContext(mock.patch.dict(os.environ, {"SIMPLETUNER_CACHE": str(cls.cache)}))


class BuiltinModelFolderTest(BuiltinCacheCase):
    def test_sd_and_sdxl_folders_have_the_diffusers_layout(self):
        expected = {
            "tiny-sd1x": ("StableDiffusionPipeline", {"unet", "vae", "text_encoder", "tokenizer",
                                                      "scheduler"}),
            "tiny-sd2x": ("StableDiffusionPipeline", {"unet", "vae", "text_encoder", "tokenizer",
                                                      "scheduler"}),
            "tiny-sdxl": ("StableDiffusionXLPipeline", {"unet", "vae", "text_encoder",
                                                        "tokenizer", "text_encoder_2",
                                                        "tokenizer_2", "scheduler"}),
        }
        for name, (pipeline_class, subfolders) in expected.items():
            with self.subTest(name=name):
                folder = resolve_model_path(f"builtin:{name}")
                self.assertEqual(folder, self.cache / "builtin" / name)
                index = json.loads((folder / "model_index.json").read_text())
                self.assertEqual(index["_class_name"], pipeline_class)
                present = {p.name for p in folder.iterdir() if p.is_dir()}
                self.assertEqual(present, subfolders)
                size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
                self.assertLess(size, 10 * 2**20, "tiny models must stay tiny")

    def test_prediction_types_differ_between_sd1x_and_sd2x(self):
        types = {}
        for name in ("tiny-sd1x", "tiny-sd2x"):
            config = json.loads((ensure_builtin_model(name) / "scheduler" /
                                 "scheduler_config.json").read_text())
            types[name] = config.get("prediction_type")
        self.assertEqual(types, {"tiny-sd1x": "epsilon", "tiny-sd2x": "v_prediction"})

    def test_no_staging_folders_are_left_behind(self):
        ensure_builtin_model("tiny-sd1x")
        leftovers = [p.name for p in (self.cache / "builtin").iterdir() if p.name.startswith(".")]
        self.assertEqual(leftovers, [])


    def test_a_build_made_with_other_library_versions_is_replaced(self):
        folder = ensure_builtin_model("tiny-sd1x")
        marker_path = folder / "simpletuner_builtin.json"
        marker = json.loads(marker_path.read_text())
        installed = importlib.metadata.version("diffusers")
        self.assertEqual(marker["libraries"]["diffusers"], installed)
        marker["libraries"]["diffusers"] = "0.30.0"  # as an older diffusers would have left it
        marker_path.write_text(json.dumps(marker))
        (folder / "built-by-the-other-version").write_text("")
        self.assertEqual(ensure_builtin_model("tiny-sd1x"), folder)
        self.assertFalse((folder / "built-by-the-other-version").exists())
        rebuilt = json.loads(marker_path.read_text())
        self.assertEqual(rebuilt["libraries"]["diffusers"], installed)
        self.assertEqual(rebuilt["libraries"]["torch"], importlib.metadata.version("torch"))

class BuiltinDeterminismTest(unittest.TestCase):
    def test_two_builds_give_identical_weights_and_leave_the_global_rng_alone(self):
        torch.manual_seed(1234)
        state = torch.get_rng_state()
        folders = []
        with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
            for cache in (first, second):
                with mock.patch.dict(os.environ, {"SIMPLETUNER_CACHE": cache}):
                    folders.append(ensure_builtin_model("tiny-sd1x"))
            self.assertTrue(torch.equal(torch.get_rng_state(), state))
            weights = [load_file(f / "unet" / "diffusion_pytorch_model.safetensors")
                       for f in folders]
            self.assertEqual(weights[0].keys(), weights[1].keys())
            for key in weights[0]:
                self.assertTrue(torch.equal(weights[0][key], weights[1][key]), key)


class BuiltinNamesTest(BuiltinCacheCase):
    def test_every_name_check_knows_has_a_build_function(self):
        from simpletuner.models.model_path import BUILTIN_NAMES
        from simpletuner.models.tiny import recipe

        for name in BUILTIN_NAMES:
            with self.subTest(name=name):
                self.assertTrue(callable(recipe(name)))

    def test_unknown_builtin_lists_the_known_ones(self):
        with self.assertRaises(UnknownBuiltinError) as caught:
            resolve_model_path("builtin:tiny-sd5")
        for known in ("builtin:tiny-sd1x", "builtin:tiny-sd2x", "builtin:tiny-sdxl"):
            self.assertIn(known, str(caught.exception))
        self.assertFalse((self.cache / "builtin" / "tiny-sd5").exists())

    def test_unknown_builtin_command_exits_2_with_the_known_names(self):
        stdout, stderr = io.StringIO(), io.StringIO()
        with redirect_stdout(stdout), redirect_stderr(stderr):
            code = run_builtin_command("nope")
        self.assertEqual(code, 2)
        self.assertEqual(stdout.getvalue(), "")
        self.assertIn("builtin:tiny-sdxl", stderr.getvalue())

    def test_hub_id_is_refused_with_local_folder_advice(self):
        with self.assertRaises(ModelFolderError) as caught:
            resolve_model_path("stabilityai/stable-diffusion-xl-base-1.0")
        message = str(caught.exception)
        self.assertIn("local folders only", message)
        self.assertIn("builtin:tiny-sd1x", message)

    def test_a_file_is_not_a_model_folder(self):
        with tempfile.NamedTemporaryFile(suffix=".safetensors") as file:
            with self.assertRaises(ModelFolderError) as caught:
                resolve_model_path(file.name)
        self.assertIn("is a file", str(caught.exception))

    def test_existing_local_folder_resolves_to_itself(self):
        with tempfile.TemporaryDirectory() as folder:
            self.assertEqual(resolve_model_path(folder), Path(folder).resolve())


class BuiltinCommandLineTest(BuiltinCacheCase):
    def test_concurrent_commands_agree_and_print_the_folder_last(self):
        """Two processes build the same model at once: both succeed, one folder, no debris.
        (tiny-sd3: the SD models' build pretrains their VAE, twice the CPU of the rest.)"""
        env = dict(os.environ, SIMPLETUNER_CACHE=str(self.cache))
        command = [sys.executable, "-m", "simpletuner", "builtin", "tiny-sd3"]
        with ExitStack() as both:
            runs = [both.enter_context(Launch(command, tmpdir=self.cache, env=env))
                    for _ in range(2)]
            statuses = [run.wait(timeout=300) for run in runs]
        expected = self.cache / "builtin" / "tiny-sd3"
        for status, run in zip(statuses, runs):
            self.assertEqual(status, 0, run.stderr())
            self.assertEqual(run.stdout().strip().splitlines()[-1], str(expected))
        self.assertTrue((expected / "transformer" / "diffusion_pytorch_model.safetensors").is_file())
        debris = [p.name for p in (self.cache / "builtin").iterdir() if p.name != "tiny-sd3"]
        self.assertEqual(debris, [])


if __name__ == "__main__":
    unittest.main()
