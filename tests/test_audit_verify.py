"""The audit's pure half: traces written by every simulated rank, checked against the plan."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.split import split_dataset
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.helpers.multiaspect.trace import TraceWriter, read_trace
from simpletuner.helpers.multiaspect.verify import build_plan, verify


def ids(n: int, prefix: str) -> list[str]:
    return [f"{prefix}/{i:03d}.png" for i in range(n)]


DATASETS = [
    SamplerDataset(DatasetIndex("photos", {"64x64": ids(29, "sq"), "64x128": ids(11, "t")}, {}),
                   str, 2),
    SamplerDataset(DatasetIndex("art", {"64x64": ids(9, "a")}, {}), str, 1, repeats=2),
]
WORLD, EPOCHS = 3, 3


def run_all_ranks(folder: Path, datasets=DATASETS) -> dict:
    for rank in range(WORLD):
        sampler = MultiAspectSampler(datasets, seed=4, processes=WORLD, rank=rank, accumulation=1)
        with TraceWriter(folder, rank) as writer:
            for _ in range(EPOCHS):
                for batch in sampler:
                    writer.write(batch)
    # The plan's trim comes from the pure split, independently of the sampler's iteration.
    specs = [d.spec for d in datasets]
    trimmed = {epoch: {spec.dataset_id: {key: piece.trimmed for key, piece in split_dataset(
        spec, seed=4, epoch=epoch, processes=WORLD, rank=0, accumulation=1).items()}
        for spec in specs} for epoch in range(EPOCHS)}
    return build_plan(seed=4, world_size=WORLD, accumulation=1, datasets=specs, trimmed=trimmed)


class VerifyTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.folder = Path(self.tmp.name)
        self.plan = json.loads(json.dumps(run_all_ranks(self.folder)))  # as plan.json holds it

    def tearDown(self):
        self.tmp.cleanup()

    def traces(self):
        return {rank: read_trace(self.folder, rank) for rank in range(WORLD)}

    def test_real_sampler_traces_pass_with_exact_counts(self):
        report = verify(self.plan, self.traces())
        self.assertTrue(report.ok, report.lines())
        # photos: 29 -> 24 kept (E=6), 11 -> 6 kept; art: 27 occurrences -> 27 kept (E=3).
        for summary in report.epochs:
            self.assertEqual(summary.trimmed, 5 + 5)
            self.assertEqual(summary.assigned, 24 + 6 + 27)
            self.assertEqual(summary.unique, 57)
        self.assertEqual(report.epochs[0].line(),
                         "epoch 0: 57 assigned, 57 unique, 0 missing, 0 duplicated, 10 trimmed")
        self.assertEqual(self.plan["datasets"]["art"]["repeats"], 2)
        self.assertEqual(self.plan["world_size"], 3)

    def test_a_dropped_micro_batch_is_missing(self):
        traces = self.traces()
        lost = traces[1].pop(4)
        for later in traces[1][4:]:
            if later["epoch"] == lost["epoch"]:
                later["step"] -= 1
        report = verify(self.plan, traces)
        self.assertFalse(report.ok)
        self.assertEqual(report.epochs[lost["epoch"]].missing, len(lost["samples"]))
        self.assertTrue(any("different micro-batch counts" in p for p in report.problems))

    def test_a_sample_given_twice_is_duplicated(self):
        traces = self.traces()
        traces[2][0]["samples"][0] = traces[0][0]["samples"][0]
        report = verify(self.plan, traces)
        self.assertFalse(report.ok)
        self.assertEqual(report.epochs[0].duplicated, 1)
        self.assertEqual(report.epochs[0].missing, 1)

    def test_ranks_in_different_buckets_is_a_problem(self):
        traces = self.traces()
        traces[1][3]["bucket"] = "999x999"
        report = verify(self.plan, traces)
        self.assertFalse(report.ok)
        self.assertTrue(any("step 3" in p and "different buckets" in p for p in report.problems))

    def test_missing_rank_file_is_reported(self):
        (self.folder / "rank-2.jsonl").unlink()
        with self.assertRaisesRegex(ValueError, "rank-2.jsonl"):
            read_trace(self.folder, 2)
        report = verify(self.plan, {0: read_trace(self.folder, 0), 1: read_trace(self.folder, 1)})
        self.assertFalse(report.ok)
        self.assertGreater(report.epochs[0].missing, 0)

    def test_damaged_line_names_file_and_line(self):
        with open(self.folder / "rank-0.jsonl", "a", encoding="utf-8") as handle:
            handle.write("{not json\n")
        with self.assertRaisesRegex(ValueError, r"rank-0.jsonl line \d+"):
            read_trace(self.folder, 0)


class ExtendedBucketTest(unittest.TestCase):
    def test_oversubscribed_bucket_is_expected_cyclically(self):
        datasets = [SamplerDataset(DatasetIndex("d", {"64x64": ids(4, "s"),
                                                      "64x128": ids(20, "b")}, {}),
                                   str, 2, allow_oversubscription=True)]
        with tempfile.TemporaryDirectory() as tmp:
            plan = run_all_ranks(Path(tmp), datasets)  # E = 6: the 4-sample bucket is cycled
            self.assertEqual(plan["datasets"]["d"]["extended"], {"64x64": 6})
            report = verify(plan, {r: read_trace(tmp, r) for r in range(WORLD)})
        self.assertTrue(report.ok, report.lines())
        self.assertEqual(report.epochs[0].assigned, 6 + 18)
        self.assertEqual(report.epochs[0].trimmed, 2)


if __name__ == "__main__":
    unittest.main()
