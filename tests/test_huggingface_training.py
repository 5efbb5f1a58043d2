"""Training on CPU over a type: huggingface dataset saved with the datasets library: every row
trains exactly once in the epoch (the trace), its latent is cached like any image's, and the
audit on 2 real processes finds every row exactly once per epoch."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import test_distributed
from huggingface_fixtures import save_rows, shape_rows
from training_fixtures import read_jsonl, run_in_process_logged, write_config

ROWS = 8


class HuggingFaceTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-hf-train-")
        root = Path(cls.tmp)
        save_rows(root / "shapes", {"train": shape_rows([(64, 64), (96, 64)] * (ROWS // 2))})
        cls.ids = [f"train/{row}" for row in range(ROWS)]
        dataset = {"id": "shapes", "type": "huggingface", "dataset_name": str(root / "shapes"),
                   "caption_column": "text"}
        config = write_config(root, root, "hf", datasets=[dataset], trace_samples=True,
                              num_train_epochs=1, max_train_steps=None)
        cls.result = run_in_process_logged(config, cls.tmp)
        cls.out = root / "hf-out"
        cls.audit_dir = root / "audit"
        (root / "tmp").mkdir()
        cls.audit = test_distributed.launch(
            ["--config", str(write_config(root, root, "audit", datasets=[dataset], seed=3)),
             "--output", str(cls.audit_dir), "--epochs", "2"], 2, str(root / "tmp"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_row_trains_once_and_its_latent_is_cached(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-4000:])
        trace = read_jsonl(self.out / "trace" / "rank-0.jsonl")
        self.assertEqual(sorted(s for m in trace for s in m["samples"]), sorted(self.ids))
        latents = list((self.out / "cache" / "vae" / "shapes").rglob("*.safetensors"))
        self.assertEqual(len(latents), ROWS)

    def test_the_audit_on_two_processes_finds_every_row_once(self):
        for rank, (code, out, err) in enumerate(self.audit):
            self.assertEqual(code, 0, f"rank {rank}:\n{out}\n{err[-3000:]}")
        self.assertIn("epoch 1: 8 assigned, 8 unique, 0 missing, 0 duplicated", self.audit[0][1])
        traces = [read_jsonl(self.audit_dir / f"rank-{r}.jsonl") for r in (0, 1)]
        for epoch in (0, 1):
            seen = sorted(s for t in traces for m in t if m["epoch"] == epoch
                          for s in m["samples"])
            self.assertEqual(seen, sorted(self.ids), f"epoch {epoch}")


if __name__ == "__main__":
    unittest.main()
