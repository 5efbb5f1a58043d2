"""Configuration problems as records: `check --json` names each problem's file, JSON path and
key; a configuration built from plain data is checked as the files are, and written out it
loads back the same."""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from launching import run_bounded
from simpletuner.configuration import (ConfigError, configuration_from_data, load_configuration,
                                       write_configuration_files)


class ConfigRecordsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()
        (self.root / "tmp").mkdir()
        self.config_path = self.root / "config.json"
        self.backend_path = self.root / "multidatabackend.json"

    def config(self, **options) -> dict:
        return {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                "output_dir": "out", "data_backend_config": str(self.backend_path),
                "max_train_steps": 5, **options}

    def three_mistakes(self) -> tuple[dict, list]:
        """A bad learning_rate, a video dataset's bad num_frames, another dataset's typo."""
        config = self.config(model_family="wan", pretrained_model_name_or_path="builtin:tiny-wan",
                             learning_rate=-1)
        datasets = [{"id": "photos", "instance_data_dir": "images"},
                    {"id": "clips", "instance_data_dir": "images", "dataset_type": "video",
                     "video": {"num_frames": 0}},
                    {"id": "more", "instance_data_dir": "images", "caption_stratgy": "textfile"}]
        return config, datasets

    def write(self, config: dict, datasets: list) -> None:
        self.config_path.write_text(json.dumps(config))
        self.backend_path.write_text(json.dumps(datasets))

    def check(self, *options: str):
        return run_bounded([sys.executable, "-m", "simpletuner", "check", "--config",
                            str(self.config_path), *options],
                           tmpdir=self.root / "tmp", timeout=120, cwd=self.root)

    def expected_records(self) -> list[dict]:
        config, backend = str(self.config_path), str(self.backend_path)
        return [
            {"file": config, "path": "learning_rate", "key": "learning_rate",
             "message": "key 'learning_rate' is -1; expected a value >= 0.0", "fix": ""},
            {"file": backend, "path": "datasets[1].video.num_frames", "key": "num_frames",
             "message": "key 'num_frames' is 0; expected a value >= 1", "fix": ""},
            {"file": backend, "path": "datasets[2].caption_stratgy", "key": "caption_stratgy",
             "message": "unknown key 'caption_stratgy' (did you mean 'caption_strategy'?)",
             "fix": ""},
        ]

    def test_check_json_prints_one_record_per_problem(self):
        self.write(*self.three_mistakes())
        result = self.check("--json")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(json.loads(result.stdout), self.expected_records())

    def test_the_text_report_names_the_same_problems_as_before(self):
        self.write(*self.three_mistakes())
        result = self.check()
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        backend = self.backend_path
        self.assertEqual(result.stderr.splitlines(), [
            "3 configuration problems:",
            f"  - {self.config_path}: key 'learning_rate' is -1; expected a value >= 0.0",
            f"  - {backend}: dataset [1] (id 'clips'): key 'video': key 'num_frames' is 0; "
            "expected a value >= 1",
            f"  - {backend}: dataset [2] (id 'more'): unknown key 'caption_stratgy' (did you "
            "mean 'caption_strategy'?)"])

    def test_the_same_data_given_in_python_has_the_same_records(self):
        config, datasets = self.three_mistakes()
        given = copy.deepcopy((config, datasets))
        with self.assertRaises(ConfigError) as caught:
            configuration_from_data(config, datasets, base=self.root,
                                    config_path=self.config_path)
        self.assertEqual([record.as_json() for record in caught.exception.records],
                         self.expected_records())
        self.assertEqual((config, datasets), given)  # the caller's data is left as it was

    def test_problems_on_the_command_line_and_in_the_environment_name_them(self):
        self.write(self.config(), [{"id": "photos", "instance_data_dir": "images"}])
        result = self.check("--json", "--learning_rat", "1e-4")
        self.assertEqual(result.returncode, 2, result.stderr)
        (record,) = json.loads(result.stdout)
        self.assertEqual((record["file"], record["path"], record["key"]),
                         ("command line", "learning_rat", "learning_rat"))
        with self.assertRaises(ConfigError) as caught, mock.patch.dict(
                "os.environ", {"SIMPLETUNER_LOG_LEVEL": "LOUD"}):
            load_configuration(self.config_path, cwd=self.root)
        (record,) = caught.exception.records
        self.assertEqual((record.file, record.path, record.key),
                         ("environment", "SIMPLETUNER_LOG_LEVEL", "SIMPLETUNER_LOG_LEVEL"))
        self.assertEqual(record.fix, "use one of DEBUG, INFO, WARNING, ERROR, or set log_level in "
                                     "config.json")
        self.assertEqual(caught.exception.problems, [
            "environment variable SIMPLETUNER_LOG_LEVEL is 'LOUD'; use one of DEBUG, INFO, "
            "WARNING, ERROR, or set log_level in config.json"])

    def test_what_check_finds_beyond_the_files_names_the_option_and_the_fix(self):
        self.write(self.config(output_dir="images", model_type="full", init_lora="x.safetensors"),
                   [{"id": "photos", "instance_data_dir": "images"}])
        result = self.check("--json")
        self.assertEqual(result.returncode, 2, result.stderr)
        config = str(self.config_path)
        self.assertEqual([(r["file"], r["path"], r["key"], r["fix"])
                          for r in json.loads(result.stdout)], [
            (config, "init_lora", "init_lora", "set model_type to 'lora'"),
            (config, "output_dir", "output_dir", "use an output_dir of its own, outside every "
             "dataset folder (e.g. output/<run-name>)")])

    def test_a_valid_config_checks_clean_and_round_trips_through_its_files(self):
        folder = self.root / "written"
        config = self.config(data_backend_config=str(folder / "multidatabackend.json"),
                             resolution=512)
        datasets = [{"id": "photos", "instance_data_dir": "images", "resolution": 256},
                    {"id": "off", "instance_data_dir": "/not/read", "disabled": True}]
        built = configuration_from_data(config, datasets, base=self.root,
                                        config_path=folder / "config.json")
        self.config_path = write_configuration_files(config, datasets, folder)
        self.assertEqual(self.config_path, folder / "config.json")
        self.assertEqual(load_configuration(self.config_path, cwd=self.root), built)
        self.assertEqual(built.training.output_dir, str((self.root / "out").resolve()))
        self.assertEqual(built.training.validation_resolution, 512)  # the training side
        self.assertEqual([(ds.id, ds.resolution, ds.instance_data_dir) for ds in built.datasets],
                         [("photos", 256, str((self.root / "images").resolve()))])
        result = self.check("--json")
        self.assertEqual((result.returncode, json.loads(result.stdout)), (0, []), result.stderr)


if __name__ == "__main__":
    unittest.main()
