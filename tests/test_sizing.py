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
from simpletuner.planning import run_plan


def ids(n: int) -> list[str]:
    return [f"{i}.png" for i in range(n)]


class SizingTest(unittest.TestCase):
    def test_counts_for_four_processes(self):
        specs = [DatasetSpec("photos", {"64x64": ids(50), "64x96": ids(17)}, batch_size=2),
                 DatasetSpec("art", {"64x64": ids(5)}, repeats=2, batch_size=1),
                 DatasetSpec("held", {"64x64": ids(9)}, batch_size=4, evaluation=True)]
        sizing = split_sizing(specs, 4, 2)
        photos = sizing["datasets"]["photos"]
        self.assertEqual(photos["effective_batch"], 16)
        # 50 -> 48 kept (3 steps of 16), 6 micro-batches of 2 per rank; 17 -> 16 kept.
        self.assertEqual(photos["buckets"]["64x64"], {
            "samples": 50, "occurrences": 50, "kept": 48, "trimmed": 2, "extended": False,
            "micro_batches": 6, "optimizer_steps": 3})
        self.assertEqual(photos["buckets"]["64x96"]["kept"], 16)
        # art: 15 occurrences, E = 8 -> 8 kept, 2 micro-batches of 1 per rank.
        self.assertEqual(sizing["datasets"]["art"]["buckets"]["64x64"]["kept"], 8)
        # evaluation: E = 4 processes, not counted in training steps.
        self.assertEqual(sizing["datasets"]["held"]["effective_batch"], 4)
        self.assertEqual(sizing["datasets"]["held"]["buckets"]["64x64"]["kept"], 8)
        self.assertEqual(sizing["micro_batches_per_epoch"], 6 + 2 + 2)
        self.assertEqual(sizing["optimizer_steps_per_epoch"], 5)
        self.assertIsNone(sizing["problem"])
        self.assertIn("10 micro-batches per rank, 5 optimizer steps", sizing_table(sizing))

    def test_undersized_bucket_is_flagged_with_the_error(self):
        specs = [DatasetSpec("photos", {"64x64": ids(50), "64x96": ids(3)}, batch_size=2)]
        sizing = split_sizing(specs, 8, 1)
        self.assertEqual(sizing["datasets"]["photos"]["buckets"]["64x96"]["kept"], 0)
        self.assertIn("needs repeats >= 5", sizing["problem"])
        self.assertIn("TOO SMALL", sizing_table(sizing))

    def test_oversubscribed_bucket_is_marked_extended(self):
        specs = [DatasetSpec("photos", {"64x64": ids(50), "64x96": ids(3)}, batch_size=2,
                             allow_oversubscription=True)]
        sizing = split_sizing(specs, 8, 1)
        small = sizing["datasets"]["photos"]["buckets"]["64x96"]
        self.assertEqual((small["kept"], small["extended"]), (16, True))
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
        self.assertEqual(split["datasets"]["d"]["buckets"]["64x64"]["kept"], 6)
        self.assertEqual(split["datasets"]["d"]["buckets"]["64x64"]["trimmed"], 1)
        self.assertEqual(split["datasets"]["d"]["buckets"]["64x128"]["kept"], 3)
        self.assertEqual(split["micro_batches_per_epoch"], 3)


if __name__ == "__main__":
    unittest.main()
