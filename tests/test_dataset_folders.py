"""output_dir against the datasets' folders, as `check` and the preflight see it: real folders,
symlinks and relative paths through the real loader (relative to the working directory)."""

from __future__ import annotations

import json
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from PIL import Image

from simpletuner.configuration import load_configuration
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.training.run.launch_checks import launch_problems


class OutputDirPlaceTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name).resolve()
        (self.root / "data").mkdir()
        Image.new("RGB", (64, 64)).save(self.root / "data" / "a.png")
        self.config = self.root / "config.json"
        self.backend = self.root / "multidatabackend.json"

    def problems(self, output_dir: str, datasets: list[dict] | None = None, **options
                 ) -> list[str]:
        """launch_problems (what `check` reports) of a config loaded from self.root."""
        self.backend.write_text(json.dumps(datasets or [{"id": "shapes",
                                                         "instance_data_dir": "data"}]))
        self.config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": output_dir, "data_backend_config": str(self.backend),
            "max_train_steps": 4, **options}))
        return launch_problems(load_configuration(self.config, cwd=self.root))

    def assertOneProblem(self, problems: list[str], *fragments: str) -> None:
        self.assertEqual(len(problems), 1, problems)
        for fragment in (f"{self.config}: key 'output_dir'", "use an output_dir of its own",
                         *fragments):
            self.assertIn(fragment, problems[0])

    def test_a_folder_beside_the_data_is_accepted(self):
        self.assertEqual(self.problems("out"), [])

    def test_the_filesystem_root_is_refused(self):
        self.assertOneProblem(self.problems("/"), "is /, the filesystem root")

    def test_the_home_folder_is_refused(self):
        home = self.root / "home"
        home.mkdir()
        with mock.patch.dict(os.environ, {"HOME": str(home)}):
            self.assertOneProblem(self.problems("~"), f"is {home}, the home folder")
            self.assertEqual(self.problems("~/runs/one"), [])  # a folder below it is fine

    def test_the_dataset_folder_itself_is_refused(self):
        self.assertOneProblem(self.problems("data"), f"is {self.root / 'data'}, the folder of "
                              f"dataset 'shapes' (instance_data_dir in {self.backend})",
                              "train on this run's validation images")

    def test_a_relative_output_dir_inside_the_dataset_is_refused(self):
        self.assertOneProblem(self.problems("data/runs/out"),
                              f"({self.root / 'data/runs/out'}) is inside {self.root / 'data'}")

    def test_a_symlink_into_the_dataset_is_resolved_and_refused(self):
        (self.root / "elsewhere").symlink_to(self.root / "data")
        self.assertOneProblem(self.problems(str(self.root / "elsewhere" / "out")),
                              f"({self.root / 'data/out'}) is inside {self.root / 'data'}")

    def test_a_symlinked_dataset_folder_is_resolved_too(self):
        (self.root / "data-link").symlink_to(self.root / "data")
        problems = self.problems("data/out", [{"id": "linked", "instance_data_dir": "data-link"}])
        self.assertOneProblem(problems, "the folder of dataset 'linked'")

    def test_an_output_dir_holding_a_dataset_is_refused(self):
        self.assertOneProblem(self.problems("."), f"holds {self.root / 'data'}",
                              "deleting output_dir to start over would delete the dataset")

    def test_a_hidden_folder_inside_the_dataset_is_accepted_as_the_listing_skips_it(self):
        out = self.root / "data" / ".runs" / "out"
        out.mkdir(parents=True)
        Image.new("RGB", (64, 64)).save(out / "grid.png")
        self.assertEqual(LocalStorage(self.root / "data").list_files().sample_ids, ["a.png"])
        self.assertEqual(self.problems("data/.runs/out"), [])

    def test_many_entries_of_one_folder_are_one_problem_naming_a_few(self):
        datasets = [{"id": f"copy-{i}", "instance_data_dir": "data"} for i in range(12)]
        problems = self.problems("data/out", datasets)
        self.assertOneProblem(problems, "datasets 'copy-0', 'copy-1', 'copy-2', 'copy-3', "
                              "'copy-4' and 7 more")

    def test_it_is_listed_with_the_other_problems(self):
        (self.root / "data" / "checkpoint-3").mkdir()
        problems = self.problems("data", max_train_steps=None)
        text = "\n".join(problems)
        self.assertEqual(len(problems), 3, problems)
        for fragment in ("the folder of dataset 'shapes'", "set 'max_train_steps'",
                         "earlier run's checkpoints"):
            self.assertIn(fragment, text)


if __name__ == "__main__":
    unittest.main()
