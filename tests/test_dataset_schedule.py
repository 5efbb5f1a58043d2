"""Dataset scheduling (probability, start_epoch, start_step), every rank simulated in one
process: lockstep, the same step count everywhere, exactly once per pass (the audit's verify),
no micro-batch before a dataset's start, resume at any position, and SimpleTuner's semantics on
worked examples."""

from __future__ import annotations

import itertools
import json
import unittest
from collections import Counter

import numpy as np

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.permutation import stable_permutation
from simpletuner.helpers.metadata.split import split_dataset
from simpletuner.helpers.multiaspect.dataset_schedule import DatasetSchedule
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.helpers.multiaspect.trace import trace_record
from simpletuner.helpers.multiaspect.verify import build_plan, verify

SEED = 5


def ids(n: int, prefix: str) -> list[str]:
    return [f"{prefix}/{i:03d}.png" for i in range(n)]


def datasets(schedule_b: DatasetSchedule, *, tail: str = "carry", batch: int = 1,
             sizes_a=(23, 17), size_b: int = 13, repeats_b: int = 1) -> list[SamplerDataset]:
    a = DatasetIndex("a", {"64x64": ids(sizes_a[0], "a-sq"), "96x64": ids(sizes_a[1], "a-w")}, {})
    b = DatasetIndex("b", {"64x64": ids(size_b, "b-sq")}, {})
    return [SamplerDataset(a, str, batch, bucket_tail=tail),
            SamplerDataset(b, str, batch, repeats=repeats_b, bucket_tail=tail,
                           schedule=schedule_b)]


def samplers(data, world: int, accumulation: int) -> list[MultiAspectSampler]:
    return [MultiAspectSampler(data, seed=SEED, processes=world, rank=rank,
                               accumulation=accumulation) for rank in range(world)]


def traces(ranks: list[MultiAspectSampler], epochs: int) -> dict[int, list[dict]]:
    return {rank: [trace_record(m) for _ in range(epochs) for m in sampler]
            for rank, sampler in enumerate(ranks)}


def plan_of(data, ranks: list[MultiAspectSampler], world: int, accumulation: int,
            epochs: int) -> dict:
    """plan.json as the audit writes it: trims and carries from the pure split, for the
    epochs the sampler's timeline puts each dataset in."""
    trimmed, carried = {}, {}
    for epoch in range(epochs):
        entry = ranks[0].timeline.entry(epoch)
        for d in data:  # none where it has not joined or has ended (end_epoch, end_step)
            first = entry.first_epochs.get(d.index.dataset_id) if (
                d.index.dataset_id in entry.joins) else None
            pieces = {} if first is None else split_dataset(
                d.spec, seed=SEED, epoch=epoch, processes=world, rank=0,
                accumulation=accumulation, first_epoch=first)
            trimmed.setdefault(epoch, {})[d.index.dataset_id] = {
                k: p.trimmed for k, p in pieces.items()}
            carried.setdefault(epoch, {})[d.index.dataset_id] = {
                k: p.carried for k, p in pieces.items()}
    plan = build_plan(seed=SEED, world_size=world, accumulation=accumulation,
                      datasets=[d.spec for d in data], trimmed=trimmed, carried=carried,
                      schedules={d.index.dataset_id: d.schedule for d in data})
    return json.loads(json.dumps(plan))


def optimizer_steps(records: list[dict], accumulation: int) -> list[int]:
    """The 1-based optimizer step of each record (one rank's trace of consecutive epochs)."""
    before, per_epoch = 0, Counter(r["epoch"] for r in records)
    starts = {}
    for epoch in sorted(per_epoch):
        starts[epoch] = before
        before += per_epoch[epoch] // accumulation
    return [starts[r["epoch"]] + r["step"] // accumulation + 1 for r in records]


GRID_SCHEDULES = [DatasetSchedule(), DatasetSchedule(probability=0.2),
                  DatasetSchedule(start_epoch=2), DatasetSchedule(start_step=7),
                  DatasetSchedule(probability=0.5, start_epoch=2, start_step=40),
                  DatasetSchedule(start_step=200)]

GRID_SIZES = [((23, 17), 13), ((40, 12), 30)]  # a's two buckets, b's one (E is at most 12)


class GridTest(unittest.TestCase):
    """Sizes, probabilities, start epochs and steps, world sizes, accumulation, batch sizes and
    both tails."""

    EPOCHS = 5

    def test_lockstep_exactly_once_and_no_step_before_the_start(self):
        for schedule, world, accumulation, tail, (sizes_a, size_b), batch in itertools.product(
                GRID_SCHEDULES, (1, 2, 3), (1, 2), ("carry", "trim"), GRID_SIZES, (1, 2)):
            with self.subTest(schedule=schedule, world=world, accumulation=accumulation,
                              tail=tail, sizes=(sizes_a, size_b), batch=batch):
                data = datasets(schedule, tail=tail, batch=batch, sizes_a=sizes_a,
                                size_b=size_b)
                ranks = samplers(data, world, accumulation)
                found = traces(ranks, self.EPOCHS)
                lengths = {rank: len(records) for rank, records in found.items()}
                self.assertEqual(len(set(lengths.values())), 1, lengths)
                for step_records in zip(*found.values()):
                    self.assertEqual(len({(r["dataset"], r["bucket"], r["epoch"], r["step"])
                                          for r in step_records}), 1)
                report = verify(plan_of(data, ranks, world, accumulation, self.EPOCHS), found)
                self.assertTrue(report.ok, report.lines())
                records = found[0]
                steps = optimizer_steps(records, accumulation)
                for record, step in zip(records, steps):
                    self.assertEqual(len(record["samples"]), batch)
                    if record["dataset"] == "b":
                        self.assertGreaterEqual(step, schedule.start_step)
                        self.assertGreaterEqual(record["epoch"] + 1, schedule.start_epoch)
                per_epoch = Counter(r["epoch"] for r in records)
                for epoch in per_epoch:
                    self.assertEqual(per_epoch[epoch] % accumulation, 0)

    def test_a_dataset_trains_its_whole_pass_in_the_epoch_it_joins(self):
        """SimpleTuner's rule: joining mid-epoch adds the dataset's pass to that epoch. With
        one rank, batch 1 and trim nothing is left over, so every b sample appears twice
        (repeats 1) in each epoch from its first."""
        data = datasets(DatasetSchedule(start_step=7), tail="trim")
        (sampler,) = samplers(data, 1, 1)
        records = traces([sampler], 3)[0]
        for epoch in range(3):
            got = Counter(s for r in records if r["epoch"] == epoch and r["dataset"] == "b"
                          for s in r["samples"])
            self.assertEqual(got, Counter({s: 2 for s in ids(13, "b-sq")}), epoch)
        first_b = next(i for i, r in enumerate(records) if r["dataset"] == "b")
        self.assertGreaterEqual(first_b, 6)  # steps 1..6 cannot draw it
        self.assertEqual(sum(1 for r in records if r["epoch"] == 0), 23 + 17 + 26)


class WorkedExampleTest(unittest.TestCase):
    """One rank, batch 1, no accumulation, trim: a has 8 samples (8 steps per epoch), b 4
    joining at step 5, c 3 joining at step 30: epochs of 12, 12 and 15 steps."""

    def setUp(self):
        a = DatasetIndex("a", {"64x64": ids(8, "a")}, {})
        b = DatasetIndex("b", {"64x64": ids(4, "b")}, {})
        c = DatasetIndex("c", {"64x64": ids(3, "c")}, {})
        self.data = [SamplerDataset(a, str, 1, bucket_tail="trim"),
                     SamplerDataset(b, str, 1, bucket_tail="trim",
                                    schedule=DatasetSchedule(start_step=5)),
                     SamplerDataset(c, str, 1, bucket_tail="trim",
                                    schedule=DatasetSchedule(start_step=30))]
        (self.sampler,) = samplers(self.data, 1, 1)

    def test_epoch_lengths_and_first_steps(self):
        self.assertEqual([self.sampler.micro_batches_in(e) for e in range(4)], [12, 12, 15, 15])
        self.assertEqual([p.dataset_id for p in self.sampler.slices(1)], ["a", "b"])
        self.assertEqual([p.dataset_id for p in self.sampler.slices(2)], ["a", "b", "c"])
        records = traces([self.sampler], 3)[0]
        steps = optimizer_steps(records, 1)
        first = {d: min(s for r, s in zip(records, steps) if r["dataset"] == d)
                 for d in "abc"}
        self.assertEqual(first["a"], 1)
        self.assertGreaterEqual(first["b"], 5)
        self.assertGreaterEqual(first["c"], 30)
        self.assertLess(first["c"], 37)  # epoch 2 is steps 25..39 and c has 3 of its steps

    def test_an_epoch_that_runs_out_before_a_start_ends_there(self):
        late = self.data[:2] + [SamplerDataset(DatasetIndex("c", {"64x64": ids(3, "c")}, {}),
                                               str, 1, bucket_tail="trim",
                                               schedule=DatasetSchedule(start_step=40))]
        (sampler,) = samplers(late, 1, 1)
        # epochs of 12 steps (a and b) until the one starting after step 36: 37..48 holds 40
        self.assertEqual([sampler.micro_batches_in(e) for e in range(4)], [12, 12, 12, 15])

    def test_start_epoch_counts_from_one(self):
        data = self.data[:1] + [SamplerDataset(DatasetIndex("b", {"64x64": ids(4, "b")}, {}),
                                               str, 1, schedule=DatasetSchedule(start_epoch=3))]
        (sampler,) = samplers(data, 1, 1)
        self.assertEqual([sampler.micro_batches_in(e) for e in range(4)], [8, 8, 12, 12])


class ProbabilityTest(unittest.TestCase):
    def test_equal_probabilities_keep_the_plain_shuffle(self):
        """The schedule of groups is the stable permutation of (seed, epoch) over the buckets'
        groups in canonical order, whatever the common probability."""
        for p in (1.0, 0.3):
            data = datasets(DatasetSchedule(probability=p))
            data[0] = SamplerDataset(data[0].index, str, 1, schedule=DatasetSchedule(
                probability=p))
            (sampler,) = samplers(data, 1, 1)
            for epoch in range(3):
                per_bucket = [c.optimizer_steps for c in sampler.counts(epoch)]
                canonical = np.repeat(np.arange(len(per_bucket)), per_bucket)
                expected = canonical[stable_permutation(len(canonical), "schedule", SEED, epoch)]
                buckets = [(m.dataset_id, m.bucket) for m in sampler]
                self.assertEqual(buckets, [(sampler.buckets[i][0].index.dataset_id,
                                            sampler.buckets[i][1]) for i in expected])

    def test_a_low_probability_moves_a_dataset_to_the_end_without_dropping_any(self):
        data = datasets(DatasetSchedule(probability=0.1), sizes_a=(20, 20), size_b=20,
                        repeats_b=1, tail="trim")
        (sampler,) = samplers(data, 1, 1)
        for epoch in range(3):
            records = [trace_record(m) for m in sampler]
            where = {d: [i for i, r in enumerate(records) if r["dataset"] == d] for d in "ab"}
            self.assertEqual(len(where["b"]), 40)  # 20 samples x 2: nothing dropped
            self.assertGreater(np.mean(where["b"]), np.mean(where["a"]) + 15, epoch)

    def test_the_order_is_the_same_on_every_rank_and_changes_with_the_epoch(self):
        data = datasets(DatasetSchedule(probability=0.4, start_step=3))
        ranks = samplers(data, 3, 2)
        found = traces(ranks, 2)
        orders = {rank: [(r["dataset"], r["bucket"]) for r in records]
                  for rank, records in found.items()}
        self.assertEqual(len({tuple(o) for o in orders.values()}), 1)
        epochs = [[(r["dataset"], r["bucket"]) for r in found[0] if r["epoch"] == e]
                  for e in range(2)]
        self.assertNotEqual(epochs[0], epochs[1])


def assert_resumes_anywhere(case: unittest.TestCase, data, cuts: tuple[int, ...],
                            epochs: int = 4) -> None:
    """On 2 ranks with accumulation 2: a sampler resumed at each cut (and at the middle and the
    last micro-batch) continues with the uninterrupted run's micro-batches."""
    full = traces(samplers(data, 2, 2), epochs)
    for rank in range(2):
        for cut in (*cuts, len(full[rank]) // 2, len(full[rank]) - 1):
            with case.subTest(rank=rank, cut=cut):
                before = full[rank][cut]
                resumed = MultiAspectSampler(data, seed=SEED, processes=2, rank=rank,
                                             accumulation=2)
                resumed.load_state_dict({"epoch": before["epoch"], "step": before["step"],
                                         "fingerprint": resumed.fingerprint()})
                rest = [trace_record(m) for _ in range(epochs - before["epoch"])
                        for m in resumed]
                case.assertEqual(rest, full[rank][cut:])


class ResumeTest(unittest.TestCase):
    def test_resuming_at_any_position_continues_the_same_sequence(self):
        schedule = DatasetSchedule(probability=0.5, start_epoch=2, start_step=30)
        assert_resumes_anywhere(self, datasets(schedule, batch=2), (0, 5, 24))

    def test_a_changed_schedule_is_named_in_the_resume_warning(self):
        data = datasets(DatasetSchedule(start_step=7))
        state = samplers(data, 1, 1)[0].state_dict()
        changed = datasets(DatasetSchedule(start_step=9, probability=0.5))
        (resumed,) = samplers(changed, 1, 1)
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "WARNING") as logs:
            resumed.load_state_dict(state)
        self.assertIn("datasets.b.start_step: 7 -> 9", logs.output[0])
        self.assertIn("datasets.b.probability added", logs.output[0])

    def test_defaults_leave_the_fingerprint_as_before(self):
        (sampler,) = samplers(datasets(DatasetSchedule()), 1, 1)
        self.assertEqual(set(sampler.fingerprint()["datasets"]["b"]),
                         {"batch_size", "repeats", "allow_oversubscription", "bucket_tail",
                          "index"})


class AuditCatchesTest(unittest.TestCase):
    def test_a_trace_that_draws_a_dataset_before_its_start_fails(self):
        data = datasets(DatasetSchedule(start_step=10))
        ranks = samplers(data, 2, 1)
        found = traces(ranks, 2)
        plan = plan_of(data, ranks, 2, 1, 2)
        plan["datasets"]["b"]["start_step"] = 400  # the settings say it never starts in time
        report = verify(plan, found)
        self.assertFalse(report.ok)
        self.assertTrue(any("has not joined the schedule" in p for p in report.problems),
                        report.problems)

    def test_a_plan_that_drops_a_late_datasets_first_pass_fails(self):
        data = datasets(DatasetSchedule(start_epoch=2))
        ranks = samplers(data, 2, 1)
        found = traces(ranks, 3)
        found = {rank: [r for r in records if not (r["epoch"] == 1 and r["dataset"] == "b")]
                 for rank, records in found.items()}
        report = verify(plan_of(data, ranks, 2, 1, 3), found)
        self.assertFalse(report.ok)
        self.assertGreater(report.epochs[1].missing, 0)


if __name__ == "__main__":
    unittest.main()
