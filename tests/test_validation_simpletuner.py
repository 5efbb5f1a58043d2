"""SimpleTuner's validation options: validation_resolution as 'WxH' and lists, user_prompt_library
files, validation_disable(_unconditional), guidance rescale and SD3 skip-layer guidance, checked
when loading and reaching the real pipelines."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import numpy as np
from PIL import Image

from simpletuner.configuration import ConfigError, TrainingConfig, load_configuration
from simpletuner.training.reporting.validation import run_validation
from simpletuner.training.run.launch_checks import static_problems
from simpletuner.training.settings import ValidationSettings
from model_fixtures import TinyModelCase

LIBRARY = Path(__file__).resolve().parent / "fixtures" / "simpletuner" / "quickstart" / \
    "flux.user_prompt_library.json"


def training(**options) -> TrainingConfig:
    return TrainingConfig(**{"model_family": "sd1x", "pretrained_model_name_or_path": "m",
                             "output_dir": "out", "data_backend_config": "d",
                             "validation_resolution": 64, **options})


class ValidationConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()

    def load(self, **options):
        backend = self.root / "multidatabackend.json"
        backend.write_text(json.dumps([{"id": "a", "instance_data_dir": "images"}]))
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": str(backend), "max_train_steps": 1,
            **options}))
        return load_configuration(config, cwd=self.root)

    def problems(self, **options) -> list[str]:
        with self.assertRaises(ConfigError) as caught:
            self.load(**options)
        return caught.exception.problems

    def test_sizes_as_simpletuner_writes_them(self):
        for value, sizes in (("1024x1024,1280x768", [(1024, 1024), (1280, 768)]),
                             ("512", [(512, 512)]), (256, [(256, 256)]),
                             (" 64X128 , 64", [(64, 128), (64, 64)])):
            with self.subTest(value=value):
                loaded = self.load(validation_resolution=value).training
                self.assertEqual(ValidationSettings.from_config(loaded).sizes, sizes)
        for value in ("1024x", "big", "4x4"):
            with self.subTest(value=value):
                (problem,) = self.problems(validation_resolution=value)
                self.assertIn("key 'validation_resolution'", problem)

    def test_each_side_must_be_on_the_bucket_alignment(self):
        loaded = self.load(validation_resolution="1024x1000,512", aspect_bucket_alignment=64)
        (problem,) = [p for p in static_problems(loaded) if p.key == "validation_resolution"]
        self.assertIn("multiple of aspect_bucket_alignment (64)", problem.message)

    def test_the_prompt_library_adds_its_prompts_after_validation_prompt(self):
        (self.root / "config").mkdir()
        (self.root / "config" / "library.json").write_text(LIBRARY.read_text())
        loaded = self.load(validation_prompt="first",
                           user_prompt_library="config/library.json").training
        self.assertEqual(loaded.user_prompt_library, str(self.root / "config" / "library.json"))
        prompts = ValidationSettings.from_config(loaded).prompts
        library = json.loads(LIBRARY.read_text())
        self.assertEqual(prompts, ["first", *library.values()])
        (self.root / "objects.json").write_text(json.dumps(
            {"a": {"prompt": "one"}, "b": {"caption": "two"}}))
        settings = ValidationSettings.from_config(self.load(
            user_prompt_library="objects.json").training)
        self.assertEqual(settings.prompts, ["one", "two"])

    def test_a_bad_library_is_reported_when_loading(self):
        (self.root / "list.json").write_text("[1, 2]")
        (self.root / "empty.json").write_text(json.dumps({"a": {"lyrics": "x"}}))
        for name, reason in (("missing.json", "cannot read"), ("list.json", "JSON object"),
                             ("empty.json", "entry 'a' has no prompt")):
            with self.subTest(name=name):
                (problem,) = self.problems(user_prompt_library=name)
                self.assertIn("key 'user_prompt_library'", problem)
                self.assertIn(reason, problem)

    def test_family_specific_guidance_options_are_refused_elsewhere(self):
        (problem,) = self.problems(model_family="flux", validation_guidance_rescale=0.7,
                                   pretrained_model_name_or_path="builtin:tiny-flux")
        self.assertRegex(problem, r"applies to ([a-z0-9_]+, )*sd1x, sd2x and sdxl;")
        (problem,) = self.problems(validation_guidance_skip_layers=[7, 8])
        self.assertIn("applies to sd3 only", problem)

    def test_pipeline_arguments(self):
        plain = ValidationSettings.from_config(training(validation_guidance_scale=5.0))
        self.assertEqual(plain.pipeline_arguments(), {"guidance_scale": 5.0})
        off = ValidationSettings.from_config(training(
            validation_guidance_scale=5.0, validation_disable_unconditional=True,
            validation_guidance_rescale=0.7))
        self.assertEqual(off.pipeline_arguments(), {"guidance_scale": 1.0,
                                                    "guidance_rescale": 0.7})
        flux = ValidationSettings.from_config(training(
            model_family="flux", validation_guidance_scale=3.5,
            validation_disable_unconditional=True))
        self.assertEqual(flux.pipeline_arguments(), {"guidance_scale": 3.5})  # not CFG
        sd3 = ValidationSettings.from_config(training(
            model_family="sd3", validation_guidance_skip_layers=[7, 8, 9]))
        self.assertEqual(sd3.pipeline_arguments()["skip_guidance_layers"], [7, 8, 9])
        self.assertEqual(sd3.pipeline_arguments()["skip_layer_guidance_stop"], 0.2)
        disabled = ValidationSettings.from_config(training(validation_prompt="a",
                                                           validation_disable=True))
        self.assertEqual(disabled.prompts, [])


class ValidationImagesTest(TinyModelCase):
    def validate(self, family: str, output_dir: Path, **options) -> list[Path]:
        settings = ValidationSettings.from_config(training(
            model_family=family, output_dir=str(output_dir), validation_guidance_scale=4.0,
            validation_num_inference_steps=2, validation_prompt=["a red circle", "a square"],
            **options))
        return run_validation(self.load(family), settings, step=1)

    def test_every_prompt_at_every_size(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = self.validate("sd1x", Path(tmp), validation_resolution="64x32,32x64")
            sizes = [Image.open(path).size for path in paths[:-1]]
        self.assertEqual(sizes, [(64, 32), (64, 32), (32, 64), (32, 64)])

    def test_num_validation_images_per_prompt_each_with_the_next_seed(self):
        """Two prompts, three images each: the first of each is the one-image run's (seed
        validation_seed), the others differ (seeds + 1, + 2); each PNG names its prompt."""
        with tempfile.TemporaryDirectory() as tmp:
            one = self.validate("sd1x", Path(tmp) / "one")
            three = self.validate("sd1x", Path(tmp) / "three", num_validation_images=3)
            pixels = [np.asarray(Image.open(path)) for path in three[:-1]]
            prompts = [Image.open(path).text.get("prompt", "") for path in three[:-1]]
            first = [np.asarray(Image.open(path)) for path in one[:-1]]
        self.assertEqual(len(pixels), 6)
        self.assertEqual([("red" in p, "square" in p) for p in prompts],
                         [(True, False)] * 3 + [(False, True)] * 3)
        self.assertTrue(np.array_equal(pixels[0], first[0]))
        self.assertTrue(np.array_equal(pixels[3], first[1]))
        self.assertFalse(np.array_equal(pixels[0], pixels[1]))
        self.assertFalse(np.array_equal(pixels[1], pixels[2]))

    def test_guidance_rescale_and_skip_layers_reach_the_pipelines(self):
        for family, option in (("sd1x", {"validation_guidance_rescale": 0.9}),
                               ("sd3", {"validation_guidance_skip_layers": [1],
                                        "validation_guidance_skip_layers_start": 0.0,
                                        "validation_guidance_skip_layers_stop": 1.0})):
            with self.subTest(family=family), tempfile.TemporaryDirectory() as tmp:
                plain = self.validate(family, Path(tmp) / "plain")
                changed = self.validate(family, Path(tmp) / "changed", **option)
                self.assertFalse(np.array_equal(np.asarray(Image.open(plain[0])),
                                                np.asarray(Image.open(changed[0]))))


if __name__ == "__main__":
    unittest.main()
