"""./train.sh with num_processes 2 on CPU: two real gloo processes whose traces show every
sample exactly once per epoch, in lockstep, evaluating a one-image set (rank 1 runs a stand-in)."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from training_fixtures import make_shapes, read_events, read_jsonl, run_train_sh, write_config


class TwoProcessTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-ddp-")
        root = Path(cls.tmp)
        # Two buckets of 8: with batch 2 on 2 ranks (E = 4) nothing is trimmed, so every
        # sample must appear exactly once per epoch.
        cls.ids = make_shapes(root / "data", per_size=8)
        make_shapes(root / "held-out", per_size=1, sizes=((64, 64),))
        datasets = [{"id": "shapes", "instance_data_dir": str(root / "data")},
                    {"id": "held-out", "dataset_type": "eval",
                     "instance_data_dir": str(root / "held-out")}]
        config = write_config(root, root / "data", "ddp", datasets=datasets, num_processes=2,
                              num_train_epochs=2, max_train_steps=None, trace_samples=True,
                              seed=None, eval_steps_interval=4)
        # A fresh model cache: both ranks reach the built-in model before it exists, as on a
        # new cluster (transformers writes weights only from rank 0 once a group exists).
        cls.result = run_train_sh(config, cls.tmp, fresh_model_cache=True)
        cls.out = root / "ddp-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def traces(self) -> list[list[dict]]:
        return [read_jsonl(self.out / "trace" / f"rank-{rank}.jsonl") for rank in (0, 1)]

    def test_training_succeeds_on_two_processes(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-4000:])
        self.assertIn("2 processes", self.result.stderr)

    def test_the_console_shows_no_library_progress_bar(self):
        # Loading the text encoder and writing the exported pipeline showed transformers' own.
        for bar in ("Loading weights", "Writing model shards", "Loading pipeline components"):
            self.assertNotIn(bar, self.result.stderr)

    def test_every_sample_once_per_epoch(self):
        records = [r for trace in self.traces() for r in trace]
        for epoch in (0, 1):
            seen = Counter(s for r in records if r["epoch"] == epoch for s in r["samples"])
            self.assertEqual(sorted(seen), sorted(self.ids), f"epoch {epoch}")
            self.assertEqual(set(seen.values()), {1}, f"epoch {epoch}: {seen}")

    def test_ranks_run_in_lockstep(self):
        rank0, rank1 = self.traces()
        self.assertEqual(len(rank0), len(rank1))
        self.assertEqual(len(rank0), 8)  # 2 epochs x 16 samples / (2 ranks x batch 2)
        for a, b in zip(rank0, rank1):
            self.assertEqual((a["epoch"], a["step"], a["bucket"]),
                             (b["epoch"], b["step"], b["bucket"]))

    def test_an_evaluation_set_smaller_than_the_ranks_is_evaluated(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-4000:])
        logged = read_events(self.out, "eval")
        self.assertEqual([line["step"] for line in logged], [4, 8])
        self.assertTrue(all(0 < line["eval_loss"] < 10 for line in logged), logged)

    def test_the_drawn_seed_is_recorded_once_for_the_run(self):
        summary = json.loads((self.out / "training_summary.json").read_text())
        self.assertEqual(summary["processes"], 2)
        self.assertIsInstance(summary["seed"], int)
        self.assertEqual(summary["steps"], 8)


class OneRankCrashTest(unittest.TestCase):
    """A failure on one rank ends the run on every rank: no survivor waits in a collective."""

    def test_a_corrupt_cache_entry_read_by_one_rank_stops_both(self):
        with tempfile.TemporaryDirectory(prefix="st-crash-") as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=4, sizes=((64, 64),))
            config = write_config(root, root / "data", "crash", num_processes=2,
                                  max_train_steps=2)
            first = run_train_sh(config, tmp)
            self.assertEqual(first.returncode, 0, first.stderr[-3000:])
            # The second run reuses the caches; one latent entry is now damaged, and only the
            # rank that draws that sample reads it.
            entries = sorted((root / "crash-out" / "cache" / "vae").rglob("*.safetensors"))
            self.assertEqual(len(entries), 4)
            entries[0].write_bytes(b"damaged")
            # A fresh run over the same caches: the first run's last step is a checkpoint.
            for checkpoint in (root / "crash-out").glob("checkpoint-*"):
                shutil.rmtree(checkpoint)
            second = run_train_sh(config, tmp, timeout=240)
            self.assertNotEqual(second.returncode, 0)
            self.assertIn(entries[0].name, second.stderr)


if __name__ == "__main__":
    unittest.main()
