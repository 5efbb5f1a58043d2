"""`check` reports a bucket too small for the effective batch before launch when an earlier run
(or `plan`) left the dataset's index cache, without importing torch; without a cache, or with
files the cache has not seen, it leaves the question to the run. Edit targets are sized after
pairing, as the run sizes them: a target without its reference is not counted."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

from edit_fixtures import edit_datasets, make_edit_pairs
from simpletuner.configuration import load_configuration
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.training.run.launch_checks import launch_problems
from training_fixtures import check_recording_torch, make_shapes, run_training, write_config


class CachedBucketsCheckTest(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="st-check-buckets-"))
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)
        make_shapes(self.root / "data", per_size=2, sizes=((64, 64),))  # one bucket of two

    def config(self, batch: int) -> Path:
        return write_config(self.root, self.root / "data", "run", train_batch_size=batch)

    def index(self, config: Path) -> None:
        """What an earlier run (or plan) leaves: the dataset's index cache in output_dir."""
        configuration = load_configuration(config)
        (dataset,) = configuration.datasets
        MetadataBackend.from_config(dataset, configuration.training).refresh_index(False)

    def test_a_cached_index_shows_the_undersized_bucket_before_launch(self):
        self.index(self.config(batch=2))
        (record,) = launch_problems(load_configuration(self.config(batch=4)))
        self.assertEqual((record.path, record.key), ("datasets", ""))
        problem = str(record)
        self.assertIn("run-multidatabackend.json (as its index cache in output_dir shows): "
                      "Dataset 'shapes' has buckets smaller than the effective batch size E = 4",
                      problem)
        self.assertIn("bucket 64x64: 2 samples x 1 = 2 occurrences; needs repeats >= 1", problem)
        self.assertEqual(launch_problems(load_configuration(self.config(batch=2))), [])

    def test_without_a_cache_or_with_new_files_check_leaves_it_to_the_run(self):
        self.assertEqual(launch_problems(load_configuration(self.config(batch=4))), [])
        self.index(self.config(batch=2))
        make_shapes(self.root / "data", per_size=4, sizes=((64, 64),))  # two headers unread
        self.assertEqual(launch_problems(load_configuration(self.config(batch=4))), [])

    def test_check_reads_the_cache_without_torch_and_exits_2(self):
        self.index(self.config(batch=2))
        config = self.config(batch=4)
        result = check_recording_torch(config, self.root)
        self.assertEqual(result.stdout.split(), ["False", "2"], result.stderr[-3000:])
        self.assertIn("has buckets smaller than the effective batch size", result.stderr)


class PairedBucketsCheckTest(unittest.TestCase):
    """Four targets in one bucket, one of them with its reference: one pair, below E = 2."""

    def test_check_and_the_run_size_the_bucket_after_pairing(self):
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        targets, references, _ = make_edit_pairs(root, count=4)
        for reference in sorted(references.iterdir())[1:]:
            reference.unlink()
        config = write_config(root, targets, "run", datasets=edit_datasets(targets, references),
                              model_family="flux", model_flavour="kontext",
                              pretrained_model_name_or_path="builtin:tiny-flux-kontext")
        configuration = load_configuration(config)
        for dataset in (*configuration.datasets, *configuration.references):  # as plan leaves
            MetadataBackend.from_config(dataset, configuration.training).refresh_index(False)
        undersized = ("Dataset 'edits' has buckets smaller than the effective batch size E = 2"
                      " (train_batch_size 2")
        (problem,) = map(str, launch_problems(configuration))
        self.assertIn(undersized, problem)
        self.assertIn("bucket 64x64: 1 samples x 1 = 1 occurrences", problem)
        run = run_training(config, str(root))
        self.assertEqual(run.returncode, 2, run.stderr[-3000:])
        self.assertIn(undersized, run.stderr)
        self.assertIn("bucket 64x64: 1 samples x 1 = 1 occurrences", run.stderr)


if __name__ == "__main__":
    unittest.main()
