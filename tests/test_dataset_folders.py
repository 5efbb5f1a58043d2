"""output_dir against the datasets' folders, and folders shared by datasets, as `check` and the
preflight see them: real folders, symlinks and relative paths through the real loader (relative
to the working directory), `python -m simpletuner check` and a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from PIL import Image

from simpletuner.configuration import load_configuration
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.training.run.launch_checks import launch_problems, launch_warnings

from launching import run_bounded
from training_fixtures import (check_recording_torch, environment, make_shapes,
                               run_in_process_logged, write_config)


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
        """launch_problems of a config loaded from self.root, as `check` prints them."""
        self.backend.write_text(json.dumps(datasets or [{"id": "shapes",
                                                         "instance_data_dir": "data"}]))
        self.config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": output_dir, "data_backend_config": str(self.backend),
            "max_train_steps": 4, **options}))
        return [str(problem)
                for problem in launch_problems(load_configuration(self.config, cwd=self.root))]

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


class SharedFolderWarningTest(unittest.TestCase):
    """Datasets reading one folder into different latent caches: a warning, not a refusal."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls._tmp.name).resolve()
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        make_shapes(cls.root / "other-data", per_size=2, sizes=((64, 64),))
        cls.images = sorted((cls.root / "data").glob("*.png"))
        cls.bytes = sum(path.stat().st_size for path in cls.images)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def datasets(self, count: int, **keys) -> list[dict]:
        return [{"id": f"copy-{i}", "instance_data_dir": str(self.root / "data"),
                 "caption_strategy": "textfile", **keys} for i in range(count)]

    def check(self, name: str, datasets: list[dict]) -> subprocess.CompletedProcess:
        config = write_config(self.root, self.root / "data", name, datasets=datasets)
        return run_bounded([sys.executable, "-m", "simpletuner", "check", "--config", str(config)],
                           tmpdir=self.root, env=environment(str(self.root)), timeout=300)

    def test_check_warns_with_the_duplicated_images_and_bytes_and_accepts(self):
        result = self.check("two", self.datasets(2))
        self.assertEqual((result.returncode, result.stdout), (0, "1\n"), result.stderr)
        (warning,) = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        for fragment in (f"{self.root / 'two-multidatabackend.json'}: datasets 'copy-0', "
                         f"'copy-1' read the same folder {self.root / 'data'} (2 images, "
                         f"{self.bytes:,} bytes) into 2 latent cache folders",
                         f"(2 extra latents from {self.bytes:,} bytes of images)",
                         "'repeats'", "'cache_dir_vae'"):
            self.assertIn(fragment, warning)

    def test_a_thousand_entries_of_one_folder_are_one_warning(self):
        result = self.check("many", self.datasets(1_000))
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        (warning,) = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        self.assertIn("'copy-4' and 995 more read the same folder", warning)
        self.assertIn(f"({999 * 2} extra latents from {999 * self.bytes:,} bytes", warning)

    def test_check_with_these_checks_imports_no_torch(self):
        # train.sh runs check before accelerate: it must stay quick, so torch-free.
        config = write_config(self.root, self.root / "data", "lean", datasets=self.datasets(2),
                              output_dir=str(self.root / "data" / "out"))
        result = check_recording_torch(config, self.root)
        self.assertEqual(result.stdout.split(), ["False", "2"], result.stderr[-3000:])
        self.assertIn("warning:", result.stderr)
        self.assertIn("is inside", result.stderr)

    def test_one_cache_folder_shares_the_latents_and_is_not_warned_about(self):
        for name, datasets in (
                ("one-cache", self.datasets(2, cache_dir_vae=str(self.root / "latents"))),
                ("apart", [*self.datasets(1), {"id": "other", "instance_data_dir":
                                               str(self.root / "other-data")}])):
            with self.subTest(name):
                config = write_config(self.root, self.root / "data", name, datasets=datasets)
                self.assertEqual(launch_warnings(load_configuration(config)), [])

    def test_a_run_warns_at_start_up_and_caches_each_image_once_per_dataset(self):
        config = write_config(self.root, self.root / "data", "run", datasets=self.datasets(2),
                              max_train_steps=1)
        result = run_in_process_logged(config, str(self.root))  # what a run does
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("WARNING simpletuner.training.preflight: "
                      f"{self.root / 'run-multidatabackend.json'}: datasets 'copy-0', 'copy-1' "
                      "read the same folder", result.stderr)
        # What the warning says: each dataset cached its own latent of every image.
        for dataset_id in ("copy-0", "copy-1"):
            cache = self.root / "run-out" / "cache" / "vae" / dataset_id
            self.assertEqual(len(list(cache.rglob("*.safetensors"))), len(self.images))

    def test_a_run_with_one_cache_dir_vae_caches_each_image_once(self):
        # The advice the warning gives: equal latents of the two entries are one file.
        cache = self.root / "shared-latents"
        config = write_config(self.root, self.root / "data", "shared",
                              datasets=self.datasets(2, cache_dir_vae=str(cache)),
                              max_train_steps=1)
        result = run_in_process_logged(config, str(self.root))  # what a run does
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertNotIn("read the same folder", result.stderr)
        self.assertEqual(len(list(cache.rglob("*.safetensors"))), len(self.images))


if __name__ == "__main__":
    unittest.main()
