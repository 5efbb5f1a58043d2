"""Real processes (gloo on CPU, 3 ranks): the audit of a dataset schedule through the real
start-up and sampler. A dataset drawn with probability 0.5 that joins at epoch 2 and one that
joins at step 6: every rank in lockstep with the same step count, every occurrence of every
pass once (the audit's verdict), and no micro-batch of a dataset before its start."""

from __future__ import annotations

import json
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from PIL import Image

import test_distributed as distributed

WORLD = 3
MID_START_STEP = 6
SIZES = [(64, 64), (96, 64)]
DATASETS = {"photos": (40, {}), "late": (12, {"start_epoch": 2, "probability": 0.5}),
            "mid": (16, {"start_step": MID_START_STEP})}


def make_datasets(root: Path, datasets: dict[str, tuple[int, dict]], sizes) -> None:
    """dataset id -> (images, its schedule keys): images of the sizes in turn, in root/<id>/,
    and multidatabackend.json naming them."""
    backends = []
    for dataset_id, (count, keys) in datasets.items():
        for i in range(count):
            path = root / dataset_id / f"{dataset_id}_{i:03d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", sizes[i % len(sizes)], (i * 30 % 256, 80, 140)).save(path)
        backends.append({"id": dataset_id, "instance_data_dir": str(root / dataset_id),
                         "caption_strategy": "filename", **keys})
    (root / "multidatabackend.json").write_text(json.dumps(backends))


def audit_in_processes(case: type, datasets: dict[str, tuple[int, dict]], sizes, *,
                       seed: int, epochs: int) -> None:
    """For setUpClass: the datasets written to a temporary folder and the audit run on them
    over WORLD gloo processes (case.root, case.output, case.results)."""
    case._tmp = tempfile.TemporaryDirectory()
    case.root = Path(case._tmp.name)
    (case.root / "tmp").mkdir()
    make_datasets(case.root, datasets, sizes)
    config = distributed.write_config(case.root, "config.json", gradient_accumulation_steps=1,
                                      seed=seed)
    case.output = case.root / "audit"
    case.results = distributed.launch(["--config", str(config), "--output", str(case.output),
                                       "--epochs", str(epochs)], WORLD, str(case.root / "tmp"))


def lockstep_traces(case: unittest.TestCase) -> list[list[dict]]:
    """Every rank's audit trace, checked to be in lockstep: as many micro-batches on each, the
    same epoch, step, dataset and bucket at each."""
    traces = [[json.loads(line)
               for line in (case.output / f"rank-{r}.jsonl").read_text().splitlines()]
              for r in range(WORLD)]
    case.assertEqual(len({len(t) for t in traces}), 1)
    for records in zip(*traces):
        case.assertEqual(len({(r["epoch"], r["step"], r["dataset"], r["bucket"])
                              for r in records}), 1)
    return traces


class ScheduleAuditTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        audit_in_processes(cls, DATASETS, SIZES, seed=11, epochs=3)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_the_audit_passes_on_every_rank(self):
        for rank, (code, out, err) in enumerate(self.results):
            self.assertEqual(code, 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}")
        self.assertIn("OK: every kept occurrence assigned exactly once", self.results[0][1])
        for epoch in range(3):
            self.assertIn(f"epoch {epoch}: ", self.results[0][1])
        plan = json.loads((self.output / "plan.json").read_text())
        self.assertEqual(plan["datasets"]["late"]["probability"], 0.5)
        self.assertEqual(plan["datasets"]["mid"]["start_step"], MID_START_STEP)

    def test_lockstep_and_nothing_before_a_start(self):
        traces = lockstep_traces(self)
        per_epoch = Counter(r["epoch"] for r in traces[0])
        before = {0: 0, 1: per_epoch[0], 2: per_epoch[0] + per_epoch[1]}
        steps = {d: [before[r["epoch"]] + r["step"] + 1 for r in traces[0] if r["dataset"] == d]
                 for d in DATASETS}
        self.assertGreaterEqual(min(steps["mid"]), MID_START_STEP)
        self.assertEqual({r["epoch"] for r in traces[0] if r["dataset"] == "late"}, {1, 2})
        # E = 2 x 3 = 6. Epoch 0: photos fill 3 steps in each of its two buckets of 20; mid
        # (two buckets of 8) may start at step 6 of those 6 steps, so it joins epoch 0 with its
        # whole pass: 6 of each bucket kept (2 carried on), 12 samples in 2 more steps.
        self.assertEqual(per_epoch[0], 8)
        mid_epoch_0 = sum(len(r["samples"]) for t in traces for r in t
                          if r["dataset"] == "mid" and r["epoch"] == 0)
        self.assertEqual(mid_epoch_0, 12)

if __name__ == "__main__":
    unittest.main()
