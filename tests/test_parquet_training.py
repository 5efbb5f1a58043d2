"""The trainer's entry point on CPU over a dataset indexed from a parquet table, captions from the
table: training runs, and the trace shows exactly the table's usable rows (a row naming a
missing file is reported in skipped_files.json, not trained on). The audit on 2 real processes
over the same table finds every occurrence exactly once."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

import pyarrow
import pyarrow.parquet
from PIL import Image

import test_distributed
from training_fixtures import make_shapes, read_jsonl, run_in_process_logged, write_config


def shapes_with_a_table(root: Path, **parquet) -> tuple[list[str], dict]:
    """Generated shapes with their sizes and captions in a parquet table (caption files
    removed), plus a row for an image that does not exist; (sample ids, dataset entry)."""
    ids = make_shapes(root / "data", per_size=4)
    rows = []
    for sample_id in ids:
        with Image.open(root / "data" / sample_id) as im:
            width, height = im.size
        (root / "data" / sample_id).with_suffix(".txt").unlink()  # captions: the table's
        rows.append({"file": sample_id, "w": width, "h": height,
                     "text": f"table caption of {sample_id}"})
    rows.append({"file": "missing.png", "w": 64, "h": 64, "text": "gone"})
    table = root / "meta.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), table)
    dataset = {"id": "shapes", "instance_data_dir": str(root / "data"),
               "metadata_backend": "parquet", "caption_strategy": "parquet",
               "parquet": {"path": str(table), "filename_column": "file",
                           "width_column": "w", "height_column": "h",
                           "caption_column": "text", **parquet}}
    return ids, dataset


class ParquetTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-parquet-")
        root = Path(cls.tmp)
        cls.ids, dataset = shapes_with_a_table(root)
        config = write_config(root, root, "parquet", datasets=[dataset], trace_samples=True,
                              num_train_epochs=1, max_train_steps=None)
        cls.result = run_in_process_logged(config, cls.tmp)
        cls.audit_dir = root / "audit"
        (root / "tmp").mkdir()
        cls.audit = test_distributed.launch(
            ["--config", str(write_config(root, root, "audit", datasets=[dataset], seed=3)),
             "--output", str(cls.audit_dir), "--epochs", "2"], 2, str(root / "tmp"))
        cls.out = root / "parquet-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_training_succeeds(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-4000:])

    def test_every_usable_row_is_trained_once(self):
        trace = read_jsonl(self.out / "trace" / "rank-0.jsonl")
        self.assertEqual(sorted(s for m in trace for s in m["samples"]), sorted(self.ids))

    def test_the_bad_row_is_reported(self):
        skipped = json.loads((self.out / "skipped_files.json").read_text())["shapes"]
        self.assertEqual([s["path"] for s in skipped], ["missing.png"])
        self.assertIn("no such image", skipped[0]["reason"])

    def test_the_audit_on_two_processes_finds_every_row_once(self):
        for rank, (code, out, err) in enumerate(self.audit):
            self.assertEqual(code, 0, f"rank {rank}:\n{out}\n{err[-3000:]}")
        self.assertIn("epoch 1: 8 assigned, 8 unique, 0 missing, 0 duplicated", self.audit[0][1])
        traces = [read_jsonl(self.audit_dir / f"rank-{r}.jsonl") for r in (0, 1)]
        for epoch in (0, 1):
            seen = sorted(s for t in traces for m in t if m["epoch"] == epoch
                          for s in m["samples"])
            self.assertEqual(seen, sorted(self.ids), f"epoch {epoch}")



class TrustedTableTrainingTest(unittest.TestCase):
    """parquet.trust_table: the folder is never listed; a row whose image is missing trains
    nothing and is reported once its latent could not be cached."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-trusted-")
        root = Path(cls.tmp)
        cls.ids, dataset = shapes_with_a_table(root, trust_table=True)
        config = write_config(root, root, "trusted", datasets=[dataset], trace_samples=True,
                              num_train_epochs=1, max_train_steps=None)
        cls.result = run_in_process_logged(config, cls.tmp)
        cls.out = root / "trusted-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_training_succeeds_and_says_the_folder_was_not_listed(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-4000:])
        self.assertIn("parquet.trust_table", self.result.stderr)

    def test_the_missing_image_is_reported_and_every_other_row_trained_once(self):
        trace = read_jsonl(self.out / "trace" / "rank-0.jsonl")
        self.assertEqual(sorted(s for m in trace for s in m["samples"]), sorted(self.ids))
        skipped = json.loads((self.out / "skipped_files.json").read_text())["shapes"]
        self.assertEqual([s["path"] for s in skipped], ["missing.png"])
        self.assertIn("FileNotFoundError", skipped[0]["reason"])


if __name__ == "__main__":
    unittest.main()
