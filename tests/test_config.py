"""Configuration loading: every problem reported at once, each naming the file and the key."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration


class ConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()
        self.config_path = self.root / "config.json"
        self.backend_path = self.root / "multidatabackend.json"

    def write(self, options: dict, datasets) -> None:
        base = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                "output_dir": "out", "data_backend_config": str(self.backend_path)}
        self.config_path.write_text(json.dumps({**base, **options}))
        self.backend_path.write_text(json.dumps(datasets))

    def dataset(self, **overrides) -> dict:
        return {"id": "photos", "instance_data_dir": str(self.root / "images"), **overrides}

    def problems(self, options: dict, datasets) -> list[str]:
        self.write(options, datasets)
        with self.assertRaises(ConfigError) as caught:
            load_configuration(self.config_path, cwd=self.root)
        return caught.exception.problems

    def test_valid_config_with_dashed_keys_and_inheritance(self):
        self.write({"--train_batch_size": 3, "resolution": 512, "resolution_type": "pixel"},
                   [self.dataset(), self.dataset(id="small", resolution=256),
                    self.dataset(id="off", disabled=True, instance_data_dir="/does/not/matter")])
        config = load_configuration(self.config_path, cwd=self.root)
        self.assertEqual(config.training.train_batch_size, 3)
        self.assertEqual(config.training.output_dir, str((self.root / "out").resolve()))
        self.assertEqual([d.id for d in config.datasets], ["photos", "small"])
        self.assertEqual([d.resolution for d in config.datasets], [512, 256])
        self.assertEqual(config.datasets[0].resolution_type, "pixel")

    def test_bucket_tail_is_config_wide_with_a_dataset_override(self):
        self.write({}, [self.dataset(), self.dataset(id="kept", bucket_tail="trim")])
        config = load_configuration(self.config_path, cwd=self.root)
        self.assertEqual(config.training.bucket_tail, "carry")  # the default
        self.assertEqual([d.bucket_tail for d in config.datasets], ["carry", "trim"])
        self.write({"bucket_tail": "trim"}, [self.dataset(), self.dataset(id="on",
                                                                          bucket_tail="carry")])
        config = load_configuration(self.config_path, cwd=self.root)
        self.assertEqual([d.bucket_tail for d in config.datasets], ["trim", "carry"])
        problems = self.problems({"bucket_tail": "drop"}, [self.dataset(bucket_tail="cary")])
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("key 'bucket_tail' is 'drop'; expected one of 'carry', 'trim'", problems[0])
        self.assertIn("did you mean 'carry'", problems[1])
        problems = self.problems({}, [self.dataset(), self.dataset(id="held", dataset_type="eval",
                                                                   bucket_tail="trim")])
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("(id 'held'): key 'bucket_tail' shapes training epochs", problems[0])

    def test_typo_gets_a_suggestion(self):
        problems = self.problems({"train_batch_sise": 2}, [self.dataset(caption_stratgy="textfile")])
        self.assertEqual(len(problems), 2)
        self.assertIn("train_batch_sise", problems[0])
        self.assertIn("did you mean 'train_batch_size'", problems[0])
        self.assertIn(str(self.config_path), problems[0])
        self.assertIn("did you mean 'caption_strategy'", problems[1])
        self.assertIn(str(self.backend_path), problems[1])

    def test_bad_type_and_range_name_the_expected_form(self):
        problems = self.problems({"train_batch_size": "two", "gradient_accumulation_steps": 0,
                                  "resolution_type": "pixels"}, [self.dataset()])
        text = "\n".join(problems)
        self.assertEqual(len(problems), 3)
        self.assertIn("'train_batch_size' is 'two'; expected an integer", text)
        self.assertIn("'gradient_accumulation_steps' is 0; expected a value >= 1", text)
        self.assertIn("did you mean 'pixel'", text)

    def test_missing_folder(self):
        problems = self.problems({}, [self.dataset(instance_data_dir=str(self.root / "nope"))])
        self.assertEqual(len(problems), 1)
        self.assertIn("instance_data_dir", problems[0])
        self.assertIn("does not exist", problems[0])

    def test_several_problems_in_both_files_are_reported_together(self):
        problems = self.problems(
            {"learning_rate": "fast"},
            [self.dataset(), self.dataset(),                       # duplicate id
             {"instance_data_dir": str(self.root / "images")},     # no id
             self.dataset(id="bad id!", type="s3", minimum_aspect_ratio=2, maximum_aspect_ratio=1)],
        )
        text = "\n".join(problems)
        self.assertIn("learning_rate", text)
        self.assertIn("duplicate id 'photos'", text)
        self.assertIn("missing required key 'id'", text)
        self.assertIn("not supported yet", text)
        self.assertIn("'minimum_aspect_ratio' (2.0) is larger", text)
        self.assertIn("use letters, digits", text)
        self.assertGreaterEqual(len(problems), 6)

    def test_a_zero_aspect_limit_is_simpletuners_no_limit(self):
        # SimpleTuner turns a limit of 0 off; here the default applies instead (buckets.py)
        self.write({}, [self.dataset(minimum_aspect_ratio=2, maximum_aspect_ratio=0)])
        dataset = load_configuration(self.config_path, cwd=self.root).datasets[0]
        self.assertEqual((dataset.minimum_aspect_ratio, dataset.maximum_aspect_ratio), (2, 0))

    def test_loss_options_the_family_would_ignore_are_problems(self):
        problems = self.problems({"model_family": "flux", "snr_gamma": 5.0,
                                  "pretrained_model_name_or_path": "builtin:tiny-flux"},
                                 [self.dataset()])
        self.assertEqual(len(problems), 1)
        self.assertIn("'snr_gamma'", problems[0])
        self.assertIn("flow matching", problems[0])
        problems = self.problems({"flow_shift": 3.0, "--flow_logit_mean": 0.5}, [self.dataset()])
        self.assertEqual(len(problems), 1)
        self.assertIn("'flow_logit_mean', 'flow_shift'", problems[0])
        self.assertIn("model_family 'sd1x' would ignore them", problems[0])
        problems = self.problems({"model_family": "sd3", "flux_guidance_value": 3.5,
                                  "pretrained_model_name_or_path": "builtin:tiny-sd3"},
                                 [self.dataset()])
        self.assertEqual(len(problems), 1)
        self.assertIn("'flux_guidance_value' applies to model_families 'flux' and 'flux2' "
                      "only", problems[0])
        self.write({"model_family": "sd3", "flow_shift": 3.0, "snr_gamma": None,
                    "pretrained_model_name_or_path": "builtin:tiny-sd3"}, [self.dataset()])
        self.assertEqual(load_configuration(self.config_path, cwd=self.root).training.flow_shift,
                         3.0)

    def test_same_key_with_and_without_dashes_is_a_problem(self):
        problems = self.problems({"seed": 1, "--seed": 2}, [self.dataset()])
        self.assertEqual(len(problems), 1)
        self.assertIn("given twice", problems[0])

    def test_a_duplicate_id_does_not_hide_that_datasets_other_problems(self):
        problems = self.problems({}, [
            self.dataset(),
            self.dataset(instance_data_dir=str(self.root / "gone"), type="s3",
                         minimum_image_size=900, maximum_image_size=100)])
        text = "\n".join(problems)
        self.assertEqual(len(problems), 4, text)
        self.assertIn("dataset [1] (id 'photos'): key 'id': duplicate id 'photos'", text)
        self.assertIn(f"dataset [1] (id 'photos'): key 'instance_data_dir': folder "
                      f"{self.root / 'gone'} does not exist", text)
        self.assertIn("not supported yet", text)
        self.assertIn("'minimum_image_size' (900", text)

    def test_a_dataset_without_id_still_has_its_folder_checked(self):
        problems = self.problems({}, [{"instance_data_dir": str(self.root / "gone")}])
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("missing required key 'id'", problems[0])
        self.assertIn("does not exist", problems[1])

    def test_a_key_repeated_in_one_object_is_a_problem_in_either_file(self):
        self.config_path.write_text('{"model_family": "sd1x", "output_dir": "out", '
                                    '"pretrained_model_name_or_path": "builtin:tiny-sd1x", '
                                    '"seed": 1, "seed": 2, '
                                    f'"data_backend_config": {json.dumps(str(self.backend_path))}}}')
        self.backend_path.write_text(f'[{{"id": "a", "id": "b", '
                                     f'"instance_data_dir": {json.dumps(str(self.root))}}}]')
        with self.assertRaises(ConfigError) as caught:
            load_configuration(self.config_path, cwd=self.root)
        problems = caught.exception.problems
        self.assertEqual(len(problems), 2, problems)
        self.assertIn(f"{self.config_path}: key 'seed' appears more than once", problems[0])
        self.assertIn(f"{self.backend_path}: key 'id' appears more than once", problems[1])

    def test_only_eval_datasets_is_reported_with_the_rest_naming_the_file_and_each(self):
        problems = self.problems({"learning_rate": "fast"}, [
            self.dataset(dataset_type="eval"), self.dataset(id="held-out", dataset_type="eval"),
            self.dataset(id="off", disabled=True)])  # a disabled image dataset trains nothing
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("learning_rate", problems[0])
        self.assertTrue(problems[1].startswith(
            f"{self.backend_path}: every enabled dataset has 'dataset_type': 'eval' (dataset "
            "[0] (id 'photos'); dataset [1] (id 'held-out')), which is evaluated, never trained "
            "on"), problems[1])

    def test_an_image_dataset_with_a_problem_still_counts_as_one_to_train_on(self):
        problems = self.problems({}, [self.dataset(caption_stratgy="textfile"),
                                      self.dataset(id="held-out", dataset_type="eval")])
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("did you mean 'caption_strategy'", problems[0])

    def test_missing_required_options(self):
        self.config_path.write_text(json.dumps({"data_backend_config": str(self.backend_path)}))
        self.backend_path.write_text(json.dumps([self.dataset()]))
        with self.assertRaises(ConfigError) as caught:
            load_configuration(self.config_path, cwd=self.root)
        missing = [p for p in caught.exception.problems if "missing required key" in p]
        self.assertEqual(len(missing), 3)  # model_family, pretrained_model_name_or_path, output_dir

    def test_unreadable_json_names_line_and_column(self):
        self.config_path.write_text('{"model_family": "sd1x",\n "seed": }')
        with self.assertRaises(ConfigError) as caught:
            load_configuration(self.config_path, cwd=self.root)
        self.assertIn("line 2", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
