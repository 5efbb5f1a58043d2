"""The audit's check of bucket_tail carry and of evaluation sets of any size: traces of every
simulated rank against the plan, and splits that break the invariant caught."""

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


def audit(folder: Path, datasets: list[SamplerDataset], *, world: int, epochs: int,
          evaluation: bool = False) -> tuple[dict, dict]:
    """(plan, traces) as the audit makes them: each rank's sampler traced, the plan's trims and
    carries from the pure split."""
    for rank in range(world):
        sampler = MultiAspectSampler(datasets, seed=8, processes=world, rank=rank,
                                     accumulation=1, evaluation=evaluation)
        with TraceWriter(folder, rank) as writer:
            for _ in range(epochs):
                for batch in sampler:
                    writer.write(batch)
    specs = [d.spec for d in datasets if d.evaluation == evaluation]
    pieces = {epoch: {spec.dataset_id: split_dataset(spec, seed=8, epoch=epoch, processes=world,
                                                     rank=0, accumulation=1) for spec in specs}
              for epoch in range(epochs)}

    def listed(kind: str) -> dict:
        return {epoch: {d: {key: getattr(p, kind) for key, p in buckets.items()}
                        for d, buckets in by_dataset.items()}
                for epoch, by_dataset in pieces.items()}

    plan = build_plan(seed=8, world_size=world, accumulation=1, datasets=specs,
                      trimmed=listed("trimmed"), carried=listed("carried"))
    plan = json.loads(json.dumps(plan))  # as plan.json holds it
    return plan, {rank: read_trace(folder, rank) for rank in range(world)}


class IssueCaseTest(unittest.TestCase):
    """100 images, batch 2, 8 processes (E = 16), five epochs."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.folder = Path(self.tmp.name)

    def run_audit(self, tail: str):
        photos = SamplerDataset(DatasetIndex("photos", {"64x64": ids(100, "p")}, {}), str, 2,
                                bucket_tail=tail)
        return audit(self.folder, [photos], world=8, epochs=5)

    def test_carry_trains_every_occurrence_of_every_pass_once(self):
        plan, traces = self.run_audit("carry")
        report = verify(plan, traces)
        self.assertTrue(report.ok, report.lines())
        # Leftovers 100 mod 16 = 4, then (4 + 100) mod 16 = 8, 12, 0, 4: epoch 3 trains 112.
        self.assertEqual([e.carried for e in report.epochs], [4, 8, 12, 0, 4])
        self.assertEqual([e.assigned for e in report.epochs], [96, 96, 96, 112, 96])
        self.assertEqual([(e.missing, e.duplicated, e.trimmed) for e in report.epochs],
                         [(0, 0, 0)] * 5)
        self.assertEqual(report.untrained, 4)
        self.assertIn("only the last epoch's 4 (short of one effective batch) are untrained",
                      report.lines()[-1])
        self.assertEqual(sum(e.assigned for e in report.epochs) + report.untrained, 500)

    def test_trim_loses_four_every_epoch(self):
        report = verify(*self.run_audit("trim"))
        self.assertTrue(report.ok, report.lines())
        self.assertEqual([(e.assigned, e.trimmed, e.carried) for e in report.epochs],
                         [(96, 4, 0)] * 5)

    def test_a_carried_occurrence_trained_late_is_caught(self):
        plan, traces = self.run_audit("carry")
        # Epoch 1 opens with the 4 carried in: rank 0's first micro-batch holds two of them.
        # Swapping it with rank 0's last keeps every count and the lockstep.
        epoch_1 = [r for r in traces[0] if r["epoch"] == 1]
        epoch_1[0]["samples"], epoch_1[-1]["samples"] = (epoch_1[-1]["samples"],
                                                         epoch_1[0]["samples"])
        report = verify(plan, traces)
        self.assertEqual(sum(e.missing + e.duplicated for e in report.epochs), 0)
        self.assertFalse(report.ok)
        self.assertTrue(any("epoch 1: dataset 'photos' bucket 64x64: occurrences carried from "
                            "epoch 0 are not trained first" in p for p in report.problems),
                        report.problems)

    def test_a_plan_that_trims_what_the_settings_carry_is_caught(self):
        plan, traces = self.run_audit("carry")
        plan["epochs"]["0"], plan["carried"]["0"] = plan["carried"]["0"], {"photos": {}}
        problems = verify(plan, traces).problems
        self.assertIn("epoch 0: dataset 'photos' bucket 64x64: 4 occurrences trimmed, expected "
                      "none", problems)
        self.assertIn("epoch 0: dataset 'photos' bucket 64x64: 0 occurrences carried into "
                      "epoch 1, expected (0 carried in + 100) mod E=16 = 4", problems)


class EvaluationAuditTest(unittest.TestCase):
    """2 evaluation images on 8 processes: each evaluated once, six ranks run stand-ins."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        held = SamplerDataset(DatasetIndex("held", {"64x64": ids(2, "h")}, {}), str, 1,
                              evaluation=True)
        self.plan, self.traces = audit(Path(tmp.name), [held], world=8, epochs=1,
                                       evaluation=True)

    def test_each_sample_once_and_every_rank_one_step(self):
        report = verify(self.plan, self.traces)
        self.assertTrue(report.ok, report.lines())
        self.assertEqual((report.epochs[0].assigned, report.epochs[0].unique), (2, 2))
        self.assertEqual({len(t) for t in self.traces.values()}, {1})
        self.assertEqual(sum(t[0]["stand_in"] for t in self.traces.values()), 6)

    def test_a_stand_in_counted_as_evaluated_is_a_duplicate(self):
        stand_in = next(t[0] for t in self.traces.values() if t[0]["stand_in"])
        stand_in["stand_in"] = False
        report = verify(self.plan, self.traces)
        self.assertFalse(report.ok)
        self.assertEqual(report.epochs[0].duplicated, 1)


if __name__ == "__main__":
    unittest.main()
