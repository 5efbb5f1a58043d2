"""plan --num-processes arithmetic: kept, trimmed, micro-batches and steps for hypothetical ranks."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import unittest
from pathlib import Path

from PIL import Image

from simpletuner.helpers.metadata.split import DatasetSpec
from simpletuner.helpers.metadata.sizing import sizing_table, split_sizing
from simpletuner.plan_report import undersized_buckets
from simpletuner.planning import run_plan


def ids(n: int) -> list[str]:
    return [f"{i}.png" for i in range(n)]


class SizingTest(unittest.TestCase):
    def test_counts_for_four_processes(self):
        specs = [DatasetSpec("photos", {"64x64": ids(50), "64x96": ids(17)}, batch_size=2,
                             bucket_tail="trim"),
                 DatasetSpec("art", {"64x64": ids(5)}, repeats=2, batch_size=1,
                             bucket_tail="trim"),
                 DatasetSpec("held", {"64x64": ids(9)}, batch_size=4, evaluation=True)]
        sizing = split_sizing(specs, 4, 2)
        photos = sizing["datasets"]["photos"]
        self.assertEqual(photos["effective_batch"], 16)
        # 50 -> 48 kept (3 steps of 16), 6 micro-batches of 2 per rank; 17 -> 16 kept.
        self.assertEqual(photos["buckets"]["64x64"]["epochs"], [{
            "carried_in": 0, "kept": 48, "trimmed": 2, "carried_out": 0, "micro_batches": 6,
            "optimizer_steps": 3}] * 3)
        self.assertEqual(photos["buckets"]["64x96"]["epochs"][0]["kept"], 16)
        # art: 15 occurrences, E = 8 -> 8 kept, 2 micro-batches of 1 per rank.
        self.assertEqual(sizing["datasets"]["art"]["buckets"]["64x64"]["epochs"][0]["kept"], 8)
        # evaluation: every one of the 9 samples, 3 steps on each of 4 ranks (3 stand-ins),
        # not counted in training steps.
        held = sizing["datasets"]["held"]["buckets"]["64x64"]["epochs"][0]
        self.assertEqual((held["kept"], held["trimmed"], held["micro_batches"]), (9, 0, 3))
        self.assertEqual(sizing["micro_batches_per_epoch"], [6 + 2 + 2] * 3)
        self.assertEqual(sizing["optimizer_steps_per_epoch"], [5] * 3)
        self.assertIsNone(sizing["problem"])
        self.assertIn("10 micro-batches per rank, 5 optimizer steps", sizing_table(sizing))

    def test_carry_shows_each_epoch(self):
        # E = 2 x 8 x 1 = 16; 100 samples leave 4, then (4 + 100) % 16 = 8, then 12.
        specs = [DatasetSpec("photos", {"64x64": ids(100)}, batch_size=2, bucket_tail="carry")]
        sizing = split_sizing(specs, 8, 1)
        epochs = sizing["datasets"]["photos"]["buckets"]["64x64"]["epochs"]
        self.assertEqual([(e["carried_in"], e["kept"], e["carried_out"], e["trimmed"])
                          for e in epochs], [(0, 96, 4, 0), (4, 96, 8, 0), (8, 96, 12, 0)])
        self.assertEqual(sizing["micro_batches_per_epoch"], [6, 6, 6])
        table = sizing_table(sizing)
        self.assertIn("bucket_tail carry", table)
        self.assertIn("carried in", table)
        # E = 2 x 4 x 1 = 8: 13 leave 5, (5 + 13) % 8 = 2, (2 + 13) % 8 = 7: 1, 2, 1 steps.
        uneven = split_sizing([DatasetSpec("d", {"64x64": ids(13)}, batch_size=2,
                                           bucket_tail="carry")], 4, 1)
        self.assertEqual(uneven["optimizer_steps_per_epoch"], [1, 2, 1])
        self.assertIn("epochs 0, 1, 2: 1, 2, 1 micro-batches per rank, 1, 2, 1 optimizer steps",
                      sizing_table(uneven))

    def test_undersized_bucket_is_flagged_with_the_error(self):
        specs = [DatasetSpec("photos", {"64x64": ids(50), "64x96": ids(3)}, batch_size=2)]
        sizing = split_sizing(specs, 8, 1)
        self.assertEqual(sizing["datasets"]["photos"]["buckets"]["64x96"]["epochs"][0]["kept"], 0)
        self.assertIn("needs repeats >= 5", sizing["problem"])
        self.assertIn("TOO SMALL", sizing_table(sizing))

    def test_an_evaluation_set_smaller_than_the_processes_is_not_undersized(self):
        held = DatasetSpec("held", {"64x64": ids(2)}, batch_size=4, evaluation=True)
        train = DatasetSpec("d", {"64x64": ids(2)}, batch_size=4)
        self.assertEqual(undersized_buckets(held, 8, 2), set())
        self.assertEqual(undersized_buckets(train, 8, 2), {"64x64"})
        sizing = split_sizing([held], 8, 2)
        self.assertIsNone(sizing["problem"])
        self.assertEqual(sizing["datasets"]["held"]["buckets"]["64x64"]["epochs"][0]["kept"], 2)
        self.assertIn("(evaluation: every sample once)", sizing_table(sizing))

    def test_oversubscribed_bucket_is_marked_extended(self):
        specs = [DatasetSpec("photos", {"64x64": ids(50), "64x96": ids(3)}, batch_size=2,
                             allow_oversubscription=True)]
        sizing = split_sizing(specs, 8, 1)
        small = sizing["datasets"]["photos"]["buckets"]["64x96"]
        self.assertEqual((small["epochs"][0]["kept"], small["extended"]), (16, True))
        self.assertIsNone(sizing["problem"])
        self.assertIn("extended (oversubscription)", sizing_table(sizing))


class PlanCommandTest(unittest.TestCase):
    """`plan --num-processes` end to end on a tiny folder (discovery is the real one)."""

    def test_json_has_the_split_for_hypothetical_ranks(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for i in range(10):
                Image.new("RGB", (64, 64) if i < 7 else (64, 128)).save(root / f"{i}.png")
            (root / "datasets.json").write_text(json.dumps(
                [{"id": "d", "instance_data_dir": str(root), "caption_strategy": "filename"}]))
            (root / "config.json").write_text(json.dumps({
                "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                "output_dir": str(root / "out"), "data_backend_config": str(root / "datasets.json"),
                "resolution": 64, "aspect_bucket_alignment": 16, "train_batch_size": 1}))
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = run_plan(str(root / "config.json"), as_json=True, num_processes=3)
            self.assertEqual(code, 0, stderr.getvalue())
            split = json.loads(stdout.getvalue())["split"]
        self.assertEqual(split["num_processes"], 3)
        # bucket_tail carry (the default), E = 3: 7 leave 1, then (1 + 7) % 3 = 2, then 0.
        square = split["datasets"]["d"]["buckets"]["64x64"]["epochs"]
        self.assertEqual([(e["kept"], e["carried_out"], e["trimmed"]) for e in square],
                         [(6, 1, 0), (6, 2, 0), (9, 0, 0)])
        self.assertEqual(split["datasets"]["d"]["buckets"]["64x128"]["epochs"][0]["kept"], 3)
        self.assertEqual(split["micro_batches_per_epoch"], [3, 3, 4])


if __name__ == "__main__":
    unittest.main()
