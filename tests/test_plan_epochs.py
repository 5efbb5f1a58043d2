"""`python -m simpletuner plan` with `num_train_epochs` and no `max_train_steps`: the schedule
is worked out over the epochs (past the epoch where the timeline settles, its step counts are
not known and not needed), for one dataset and for a second that starts late."""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path

from discovery_fixtures import encode, image, write
from launching import run_bounded


class PlanByEpochsTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        for folder in ("first", "second"):
            for i in range(4):
                write(self.root / folder, f"{i}.png", encode(image(64, 64, seed=i), "PNG"))

    def plan(self, epochs: int, datasets: list[dict]) -> dict:
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": "multidatabackend.json",
            "resolution": 64, "aspect_bucket_alignment": 16, "num_train_epochs": epochs}))
        (self.root / "multidatabackend.json").write_text(json.dumps(datasets))
        result = run_bounded([sys.executable, "-m", "simpletuner", "plan", "--config",
                              str(config), "--json"], tmpdir=self.root, cwd=self.root,
                             timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        return json.loads(result.stdout)["schedule"]

    def test_one_dataset_over_several_epochs(self):
        for epochs in (2, 5):
            schedule = self.plan(epochs, [{"id": "first", "instance_data_dir": "first"}])
            self.assertEqual(schedule["first"]["joins"],
                             {"epoch": 1, "step_of_epoch": 1, "optimizer_step": 1})

    def test_a_dataset_starting_in_a_later_epoch_joins_within_the_epochs(self):
        datasets = [{"id": "first", "instance_data_dir": "first"},
                    {"id": "second", "instance_data_dir": "second", "start_epoch": 3}]
        for epochs in (3, 6):
            schedule = self.plan(epochs, datasets)
            self.assertEqual(schedule["second"]["joins"]["epoch"], 3)
            self.assertEqual(schedule["first"]["joins"]["epoch"], 1)


if __name__ == "__main__":
    unittest.main()
