"""report_to: wandb and all run offline into output_dir/wandb/ and hold the run's loss; a missing
wandb is a configuration problem naming the install command."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from simpletuner.training.reporting.trackers import tracker_problems, wandb_settings

from training_fixtures import make_shapes, run_training, write_config

BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed chunks


def wandb_records(path: Path):
    """The protobuf records of an offline run's .wandb file (wandb >= 0.30 has no Python
    reader): a 7-byte ':W&B' header, then chunks of (crc32, length, kind) + data, where kind 1
    is a whole record and 2-4 its first, middle and last parts."""
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    position, pending = 7, b""
    while position + 7 <= len(data):
        if BLOCK - position % BLOCK < 7:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


class WandbOfflineRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-trackers-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=4, sizes=((64, 64),))
        config = write_config(cls.root, cls.root / "data", "all", report_to="all",
                              tracker_project_name="shapes-project",
                              tracker_run_name="first-try", validation_prompt="a red circle",
                              validation_num_inference_steps=2)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
        with mock.patch.dict(os.environ, environment, clear=True):
            cls.result = run_training(config, cls.tmp)
        cls.out = cls.root / "all-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def offline_records(self) -> list:
        (run_file,) = (self.out / "wandb").glob("offline-run-*/run-*.wandb")
        return list(wandb_records(run_file))

    def test_the_offline_run_holds_every_step_and_the_trainers_final_loss(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item}
                   for record in self.offline_records() if record.HasField("history")]
        losses = {row["_step"]: row["train/loss"] for row in history if "train/loss" in row}
        final = json.loads((self.out / "training_summary.json").read_text())
        self.assertEqual(sorted(losses), list(range(1, final["steps"] + 1)))
        self.assertAlmostEqual(losses[final["steps"]], final["final_loss"], places=6)
        # The validation image of the last step, stored beside the run.
        (image,) = [row["validation/00/filenames"][0] for row in history
                    if "validation/00/filenames" in row]
        self.assertTrue(list((self.out / "wandb").glob(f"offline-run-*/files/{image}")), image)

    def test_the_run_carries_the_project_and_run_names(self):
        (run,) = [r.run for r in self.offline_records() if r.HasField("run")]
        self.assertEqual((run.project, run.display_name), ("shapes-project", "first-try"))

    def test_tensorboard_ran_beside_it(self):
        self.assertTrue(list((self.out / "logs").rglob("events.out.tfevents.*")))


class TrackerSettingsTest(unittest.TestCase):
    def test_offline_unless_configured_online(self):
        training = mock.Mock(output_dir="/out", tracker_run_name="r")
        with mock.patch.dict(os.environ, {}, clear=True):
            self.assertEqual(wandb_settings(training)["mode"], "offline")
        with mock.patch.dict(os.environ, {"WANDB_API_KEY": "k" * 40}, clear=True):
            self.assertNotIn("mode", wandb_settings(training))

    def test_missing_wandb_names_the_install(self):
        with mock.patch("importlib.util.find_spec", return_value=None):
            (problem,) = tracker_problems("wandb")
        self.assertIn("pip install 'simpletuner[wandb]'", problem)
        self.assertEqual(tracker_problems("tensorboard"), [])


if __name__ == "__main__":
    unittest.main()
