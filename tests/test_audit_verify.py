"""The audit's pure half: traces written by every simulated rank, checked against the plan
(``bucket_tail: trim``; carry and evaluation sets: test_audit_carry.py)."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.split import DatasetSpec, split_dataset
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.helpers.multiaspect.trace import TraceWriter, read_trace
from simpletuner.helpers.multiaspect.verify import (build_plan, leftover_problems,
                                                    untrimmed_occurrences, verify)


def ids(n: int, prefix: str) -> list[str]:
    return [f"{prefix}/{i:03d}.png" for i in range(n)]


DATASETS = [
    SamplerDataset(DatasetIndex("photos", {"64x64": ids(29, "sq"), "64x128": ids(11, "t")}, {}),
                   str, 2, bucket_tail="trim"),
    SamplerDataset(DatasetIndex("art", {"64x64": ids(9, "a")}, {}), str, 1, repeats=2,
                   bucket_tail="trim"),
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
    pieces = {epoch: {spec.dataset_id: split_dataset(spec, seed=4, epoch=epoch, processes=WORLD,
                                                     rank=0, accumulation=1) for spec in specs}
              for epoch in range(EPOCHS)}

    def listed(kind: str) -> dict:
        return {epoch: {d: {key: getattr(piece, kind) for key, piece in buckets.items()}
                        for d, buckets in by_dataset.items()}
                for epoch, by_dataset in pieces.items()}

    return build_plan(seed=4, world_size=WORLD, accumulation=1, datasets=specs,
                      trimmed=listed("trimmed"), carried=listed("carried"))


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
                         "epoch 0: 57 assigned, 57 unique, 0 missing, 0 duplicated, 10 trimmed, "
                         "0 carried into epoch 1")
        self.assertEqual(report.lines()[-1], "OK: every kept occurrence assigned exactly once")
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
                                   str, 2, allow_oversubscription=True, bucket_tail="trim")]
        with tempfile.TemporaryDirectory() as tmp:
            plan = run_all_ranks(Path(tmp), datasets)  # E = 6: the 4-sample bucket is cycled
            self.assertEqual(plan["datasets"]["d"]["extended"], {"64x64": 6})
            report = verify(plan, {r: read_trace(tmp, r) for r in range(WORLD)})
        self.assertTrue(report.ok, report.lines())
        self.assertEqual(report.epochs[0].assigned, 6 + 18)
        self.assertEqual(report.epochs[0].trimmed, 2)


def record(rank_ids: list[str], step: int = 0) -> dict:
    return {"epoch": 0, "step": step, "dataset": "d", "bucket": "64x64", "samples": rank_ids}


class IndependentTrimTest(unittest.TestCase):
    """The trim is re-derived from the index and settings, not taken from the split's report."""

    def plan(self, trimmed: list[str], *, samples: int = 11, evaluation: bool = False,
             accumulation: int = 1) -> dict:
        spec = DatasetSpec("d", {"64x64": ids(samples, "s")}, batch_size=2, evaluation=evaluation,
                           bucket_tail="trim")
        return build_plan(seed=1, world_size=2, accumulation=accumulation, datasets=[spec],
                          trimmed={0: {"d": {"64x64": trimmed}}}, carried={0: {"d": {}}})

    def test_a_split_that_trims_one_extra_effective_batch_is_caught(self):
        # 11 samples, E = 2 x 2 x 1 = 4: the right split trims 3 and gives each rank 2
        # micro-batches. This bad one trims 3 + 4 = 7 and gives each rank 1, and its traces
        # agree with its own plan, so counting alone finds nothing missing or duplicated.
        s = ids(11, "s")
        report = verify(self.plan(s[4:]), {0: [record(s[0:2])], 1: [record(s[2:4])]})
        self.assertEqual((report.epochs[0].missing, report.epochs[0].duplicated), (0, 0))
        self.assertFalse(report.ok)
        self.assertIn("epoch 0: dataset 'd' bucket 64x64: 7 occurrences trimmed, expected "
                      "11 mod E=4 = 3", report.problems)

    def test_the_right_trim_passes(self):
        s = ids(11, "s")
        traces = {0: [record(s[0:2]), record(s[4:6], 1)], 1: [record(s[2:4]), record(s[6:8], 1)]}
        report = verify(self.plan(s[8:]), traces)
        self.assertTrue(report.ok, report.lines())

    def test_trimming_an_id_the_bucket_does_not_hold_is_caught(self):
        problems = leftover_problems(self.plan(["s/000.png", "s/000.png", "elsewhere.png"],
                                               samples=7), 0,
                                     untrimmed_occurrences(self.plan([], samples=7)))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("trims or carries occurrences the bucket does not have", problems[0])
        self.assertIn("elsewhere.png", problems[0])
        self.assertIn("s/000.png", problems[0])

    def test_evaluation_datasets_trim_nothing(self):
        # 11 samples, 2 processes: every sample is evaluated (batch 2 and accumulation 3 ignored).
        good = self.plan([], evaluation=True, accumulation=3)
        self.assertEqual(leftover_problems(good, 0, untrimmed_occurrences(good)), [])
        bad = self.plan(ids(11, "s")[:1], evaluation=True, accumulation=3)
        self.assertIn("1 occurrences trimmed, expected none",
                      "\n".join(leftover_problems(bad, 0, untrimmed_occurrences(bad))))


if __name__ == "__main__":
    unittest.main()
