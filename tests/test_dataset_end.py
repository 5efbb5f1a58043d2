"""end_epoch and end_step (SimpleTuner's dataset keys): a dataset is no longer drawn after its
last epoch or optimizer step. Every rank simulated in one process over a grid (lockstep, equal
step counts, the audit's verify, nothing after an end), worked examples, resume at any position,
the audit catching a trace that breaks an end, and the configuration's checks."""

from __future__ import annotations

import itertools
import json
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.dataset_schedule import DatasetSchedule
from simpletuner.helpers.multiaspect.sampler import SamplerDataset
from simpletuner.helpers.multiaspect.verify import verify

from test_dataset_schedule import (assert_resumes_anywhere, ids, optimizer_steps, plan_of,
                                   samplers, traces)
from test_plan_cli import run_plan
from training_fixtures import make_shapes, write_config


def two_datasets(schedule_a: DatasetSchedule, schedule_b: DatasetSchedule, *,
                 tail: str = "carry", batch: int = 1, sizes=((23, 17), 13)):
    (a_square, a_wide), b_size = sizes
    a = DatasetIndex("a", {"64x64": ids(a_square, "a-sq"), "96x64": ids(a_wide, "a-w")}, {})
    b = DatasetIndex("b", {"64x64": ids(b_size, "b-sq")}, {})
    return [SamplerDataset(a, str, batch, bucket_tail=tail, schedule=schedule_a),
            SamplerDataset(b, str, batch, repeats=1, bucket_tail=tail, schedule=schedule_b)]


GRID = [  # (a's schedule, b's schedule)
    (DatasetSchedule(), DatasetSchedule(end_step=5)),
    (DatasetSchedule(), DatasetSchedule(end_epoch=1)),
    (DatasetSchedule(), DatasetSchedule(probability=0.3, end_epoch=2)),
    (DatasetSchedule(), DatasetSchedule(start_step=7, end_step=30)),
    (DatasetSchedule(), DatasetSchedule(start_epoch=2, end_step=60)),
    (DatasetSchedule(end_step=20), DatasetSchedule(start_step=20)),  # SimpleTuner's curriculum
    (DatasetSchedule(probability=0.5, end_step=9), DatasetSchedule(start_step=8)),
]


def window_of(schedule: DatasetSchedule, epoch: int, step: int) -> bool:
    """Whether a micro-batch at ``epoch`` (0-based) and optimizer ``step`` (1-based) may come
    from a dataset with ``schedule``: SimpleTuner's rule."""
    return (schedule.start_epoch <= epoch + 1 <= (schedule.end_epoch or epoch + 1)
            and schedule.start_step <= step <= (schedule.end_step or step))


class GridTest(unittest.TestCase):
    EPOCHS = 4

    def test_lockstep_the_audit_and_nothing_outside_a_window(self):
        for (sa, sb), world, accumulation, tail, batch in itertools.product(
                GRID, (1, 2, 3), (1, 2), ("carry", "trim"), (1, 2)):
            with self.subTest(a=sa, b=sb, world=world, accumulation=accumulation, tail=tail,
                              batch=batch):
                data = two_datasets(sa, sb, tail=tail, batch=batch)
                ranks = samplers(data, world, accumulation)
                found = traces(ranks, self.EPOCHS)
                self.assertEqual(len({len(records) for records in found.values()}), 1)
                for step_records in zip(*found.values()):
                    self.assertEqual(len({(r["dataset"], r["bucket"], r["epoch"], r["step"])
                                          for r in step_records}), 1)
                report = verify(plan_of(data, ranks, world, accumulation, self.EPOCHS), found)
                self.assertTrue(report.ok, report.lines())
                schedules = {"a": sa, "b": sb}
                records = found[0]
                for record, step in zip(records, optimizer_steps(records, accumulation)):
                    self.assertTrue(window_of(schedules[record["dataset"]], record["epoch"],
                                              step), (record, step))
                for epoch, n in Counter(r["epoch"] for r in records).items():
                    self.assertEqual(n % accumulation, 0)


class WorkedExampleTest(unittest.TestCase):
    """One rank, batch 1, no accumulation, trim: a has 40 samples (23 + 17), b 13 with repeats
    1 (26 occurrences)."""

    def run_epochs(self, schedule_b: DatasetSchedule, epochs: int) -> list[dict]:
        data = two_datasets(DatasetSchedule(), schedule_b, tail="trim")
        return traces(samplers(data, 1, 1), epochs)[0]

    def test_end_step_cuts_the_epoch_and_the_rest_of_the_pass_is_never_trained(self):
        records = self.run_epochs(DatasetSchedule(end_step=5), 3)
        epoch_0 = [r for r in records if r["epoch"] == 0]
        b_steps = [r["step"] for r in epoch_0 if r["dataset"] == "b"]
        self.assertTrue(all(step < 5 for step in b_steps), b_steps)
        self.assertEqual(len(epoch_0), 40 + len(b_steps))  # all of a, b's first 5 steps only
        self.assertEqual(Counter(s for r in epoch_0 if r["dataset"] == "a" for s in r["samples"]),
                         Counter(ids(23, "a-sq") + ids(17, "a-w")))
        for epoch in (1, 2):
            self.assertEqual([r["dataset"] for r in records if r["epoch"] == epoch], ["a"] * 40)

    def test_end_epoch_keeps_whole_epochs(self):
        records = self.run_epochs(DatasetSchedule(end_epoch=2), 3)
        self.assertEqual([sum(r["epoch"] == e for r in records) for e in range(3)], [66, 66, 40])
        self.assertEqual({r["epoch"] for r in records if r["dataset"] == "b"}, {0, 1})

    def test_the_audit_reports_what_an_end_left_untrained(self):
        data = two_datasets(DatasetSchedule(), DatasetSchedule(end_step=5), tail="trim")
        ranks = samplers(data, 1, 1)
        found = traces(ranks, 2)
        report = verify(plan_of(data, ranks, 1, 1, 2), found)
        trained_b = sum(r["dataset"] == "b" for r in found[0])
        self.assertTrue(report.ok, report.lines())
        self.assertEqual(report.epochs[0].ended, 26 - trained_b)
        self.assertEqual(report.epochs[1].ended, 0)
        self.assertIn(f"{26 - trained_b} left untrained", report.lines()[-1])


class CarryIntoTheEndTest(unittest.TestCase):
    def test_what_the_last_epoch_carries_is_reported_as_left_by_the_end(self):
        """3 ranks, batch 1: b's 26 occurrences fill 8 steps of E = 3, carrying 2 on, but b
        ends with epoch 1, so those 2 are never trained."""
        data = two_datasets(DatasetSchedule(), DatasetSchedule(end_epoch=1))
        ranks = samplers(data, 3, 1)
        report = verify(plan_of(data, ranks, 3, 1, 2), traces(ranks, 2))
        self.assertTrue(report.ok, report.lines())
        self.assertEqual([e.ended for e in report.epochs], [0, 26 % 3])


class ResumeTest(unittest.TestCase):
    def test_resuming_at_any_position_continues_the_same_sequence(self):
        data = two_datasets(DatasetSchedule(probability=0.5, end_step=12),
                            DatasetSchedule(start_step=10, end_epoch=3), batch=2)
        assert_resumes_anywhere(self, data, (0, 5, 11, 23, 24))

    def test_an_end_is_part_of_the_fingerprint(self):
        (sampler,) = samplers(two_datasets(DatasetSchedule(), DatasetSchedule(end_step=5)), 1, 1)
        self.assertEqual(sampler.fingerprint()["datasets"]["b"]["end_step"], 5)


class AuditCatchesTest(unittest.TestCase):
    def setUp(self):
        self.data = two_datasets(DatasetSchedule(), DatasetSchedule(end_step=30), tail="trim")
        ranks = samplers(self.data, 2, 1)
        self.found = traces(ranks, 2)
        self.plan = plan_of(self.data, ranks, 2, 1, 2)

    def test_a_micro_batch_after_the_end_step_fails(self):
        self.plan["datasets"]["b"]["end_step"] = 3  # the settings say it ended earlier
        report = verify(self.plan, self.found)
        self.assertFalse(report.ok)
        self.assertTrue(any("after its end" in p for p in report.problems), report.problems)

    def test_an_occurrence_trained_twice_before_the_end_fails(self):
        of_b = [i for i, r in enumerate(self.found[0]) if r["dataset"] == "b"]
        self.found[0][of_b[1]] = {**self.found[0][of_b[1]],
                                  "samples": self.found[0][of_b[0]]["samples"]}
        report = verify(self.plan, self.found)
        self.assertFalse(report.ok)
        self.assertGreater(report.epochs[0].duplicated, 0)


class GapTest(unittest.TestCase):
    """A dataset that may start only after every other one has ended: nothing could be drawn
    in between, so the run is refused, naming the empty epoch (one rank, batch 1: a has 40
    steps an epoch, b 26)."""

    def check(self, schedule_a: DatasetSchedule, schedule_b: DatasetSchedule) -> str:
        (sampler,) = samplers(two_datasets(schedule_a, schedule_b, tail="trim"), 1, 1)
        with self.assertRaises(ConfigError) as caught:
            sampler.timeline.check_every_dataset_joins(500)
        return str(caught.exception)

    def test_after_an_end_step(self):
        text = self.check(DatasetSchedule(end_step=10), DatasetSchedule(start_step=30))
        self.assertIn("no dataset is drawn in epoch 2 (from optimizer step 11): the others have "
                      "ended (end_epoch, end_step) before 'b' may start", text)

    def test_after_an_end_epoch(self):
        text = self.check(DatasetSchedule(end_epoch=1), DatasetSchedule(start_epoch=3))
        self.assertIn("no dataset is drawn in epoch 2 (from optimizer step 41)", text)

    def test_a_start_that_comes_in_time_passes(self):
        (sampler,) = samplers(two_datasets(DatasetSchedule(end_epoch=2),
                                           DatasetSchedule(start_epoch=2)), 1, 1)
        sampler.timeline.check_every_dataset_joins(500)  # would raise on a gap
        self.assertEqual(sampler.timeline.first_epoch_by(500), {"a": 0, "b": 1})


class ConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()

    def tearDown(self):
        self._tmp.cleanup()

    def load(self, *datasets: dict):
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": "multidatabackend.json",
            "max_train_steps": 1000}))
        (self.root / "multidatabackend.json").write_text(json.dumps(
            [{"instance_data_dir": str(self.root / "images"), **d} for d in datasets]))
        return load_configuration(config, cwd=self.root)

    def test_simpletuners_keys_and_its_zero_for_no_end(self):
        config = self.load({"id": "low", "end_step": 300}, {"id": "high", "start_step": 300},
                           {"id": "once", "end_epoch": 1}, {"id": "open", "end_epoch": 0})
        schedules = {ds.id: DatasetSchedule.of(ds) for ds in config.datasets}
        self.assertEqual(schedules["low"], DatasetSchedule(end_step=300))
        self.assertEqual(schedules["once"], DatasetSchedule(end_epoch=1))
        self.assertEqual(schedules["open"], DatasetSchedule())

    def test_every_mistake_at_once(self):
        with self.assertRaises(ConfigError) as caught:
            self.load({"id": "a", "start_epoch": 3, "end_epoch": 2},
                      {"id": "b", "start_step": 50, "end_step": 10},
                      {"id": "held", "dataset_type": "eval", "end_step": 5})
        text = "\n".join(caught.exception.problems)
        self.assertIn("dataset 'a': end_epoch 2 is before start_epoch 3", text)
        self.assertIn("dataset 'b': end_step 10 is before start_step 50", text)
        self.assertIn("dataset 'held': end_step shape training", text)
        self.assertIn("every training dataset has an end_epoch or end_step", text)
        self.assertNotIn("did you mean", text)


class PlanShowsTheEndTest(unittest.TestCase):
    def test_the_end_keys_and_the_epochs_without_the_ended_dataset(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "a", per_size=8, sizes=((64, 64),))
            make_shapes(root / "b", per_size=4, sizes=((64, 64),))
            config = write_config(root, root / "a", max_train_steps=30, train_batch_size=1,
                                  datasets=[{"id": "a", "instance_data_dir": str(root / "a")},
                                            {"id": "b", "instance_data_dir": str(root / "b"),
                                             "end_epoch": 1}])
            result = run_plan(config, "--json", "--num-processes", "1")
            self.assertEqual(result.returncode, 0, result.stderr[-2000:])
            found = json.loads(result.stdout)
            self.assertEqual(found["schedule"]["b"]["end_epoch"], 1)
            # a: 8 steps per epoch, b's 4 only in the first epoch
            self.assertEqual(found["split"]["micro_batches_per_epoch"][:3], [12, 8, 8])
            self.assertIn("start_step 0, end_epoch 1: joins epoch 1", run_plan(config).stdout)


if __name__ == "__main__":
    unittest.main()
