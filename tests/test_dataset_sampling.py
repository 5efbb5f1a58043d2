"""data_backend_sampling (SimpleTuner's uniform and auto-weighting) in the lockstep schedule:
the odds each draws with (pure), and over a grid with every rank simulated in one process:
lockstep, exactly once per pass (the audit's verify), resume at any position, the same order on
every rank, and the resume warning naming a changed method."""

from __future__ import annotations

import itertools
import unittest
from collections import Counter

import numpy as np

import test_dataset_schedule as schedule_case
from simpletuner.helpers.multiaspect.dataset_schedule import (DatasetSchedule, paced_permutation,
                                                              weighted_permutation)
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler
from simpletuner.helpers.multiaspect.schedule_report import schedule_table
from simpletuner.helpers.multiaspect.trace import trace_record
from simpletuner.helpers.multiaspect.verify import verify

SEED = schedule_case.SEED


def samplers(data, world: int, accumulation: int, sampling: str) -> list[MultiAspectSampler]:
    return [MultiAspectSampler(data, seed=SEED, processes=world, rank=rank,
                               accumulation=accumulation, sampling=sampling)
            for rank in range(world)]


def first_owner_share(permute, weights, owners, trials: int = 3000) -> float:
    """How often owner 0's item comes first, over ``trials`` seeds."""
    return np.mean([owners[permute(weights, owners, "t", k)[0]] == 0 for k in range(trials)])


class PacedPermutationTest(unittest.TestCase):
    owners = np.repeat([0, 1], [2, 20])  # a dataset of 2 groups, one of 20

    def test_uniform_draws_datasets_by_probability_whatever_their_size(self):
        equal = np.ones(22)
        self.assertAlmostEqual(first_owner_share(paced_permutation, equal, self.owners), 0.5,
                               delta=0.03)
        three_to_one = np.where(self.owners == 0, 3.0, 1.0)
        self.assertAlmostEqual(first_owner_share(paced_permutation, three_to_one, self.owners),
                               0.75, delta=0.03)
        # Once owner 0 has run out, only owner 1 is left: on average its 2 groups come early.
        positions = [np.flatnonzero(self.owners[paced_permutation(equal, self.owners, "t", k)]
                                    == 0).max() for k in range(500)]
        self.assertLess(np.mean(positions), 5)

    def test_auto_weighting_draws_datasets_by_probability_times_size(self):
        def weighted(weights, owners, *parts):
            return weighted_permutation(weights, *parts)
        self.assertAlmostEqual(first_owner_share(weighted, np.ones(22), self.owners), 2 / 22,
                               delta=0.02)

    def test_a_permutation_fixed_by_its_parts_each_owner_shuffled(self):
        owners = np.repeat([0, 1, 2], [5, 9, 1])
        weights = np.array([1.0, 0.2, 4.0])[owners]
        order = paced_permutation(weights, owners, "s", 1, 2)
        self.assertEqual(sorted(order.tolist()), list(range(15)))
        self.assertTrue(np.array_equal(order, paced_permutation(weights, owners, "s", 1, 2)))
        self.assertFalse(np.array_equal(order, paced_permutation(weights, owners, "s", 1, 3)))
        within = [[i for i in paced_permutation(weights, owners, "s", k) if owners[i] == 1]
                  for k in range(5)]
        self.assertGreater(len({tuple(w) for w in within}), 1)


class UniformGridTest(unittest.TestCase):
    """Sizes, probabilities, starts and ends, world sizes and accumulation under uniform."""

    EPOCHS = 3
    SCHEDULES = [DatasetSchedule(), DatasetSchedule(probability=0.2, start_step=7),
                 DatasetSchedule(probability=3.0, end_step=30)]

    def test_lockstep_exactly_once_and_the_same_order_on_every_rank(self):
        for schedule, world, accumulation, (sizes_a, size_b) in itertools.product(
                self.SCHEDULES, (1, 3), (1, 2), schedule_case.GRID_SIZES):
            with self.subTest(schedule=schedule, world=world, accumulation=accumulation,
                              sizes=(sizes_a, size_b)):
                data = schedule_case.datasets(schedule, sizes_a=sizes_a, size_b=size_b)
                ranks = samplers(data, world, accumulation, "uniform")
                found = schedule_case.traces(ranks, self.EPOCHS)
                self.assertEqual(len({len(records) for records in found.values()}), 1)
                for step_records in zip(*found.values()):
                    self.assertEqual(len({(r["dataset"], r["bucket"], r["epoch"], r["step"])
                                          for r in step_records}), 1)
                report = verify(schedule_case.plan_of(data, ranks, world, accumulation,
                                                      self.EPOCHS), found)
                self.assertTrue(report.ok, report.lines())

    def test_uniform_brings_the_small_dataset_first_auto_weighting_mixes_it(self):
        """b has 13 samples to a's 40 (one rank, batch 1): under uniform b's steps come early
        and b runs out first; under auto-weighting they spread over the epoch."""
        data = schedule_case.datasets(DatasetSchedule(), sizes_a=(20, 20), size_b=13,
                                      repeats_b=0, tail="trim")
        mean_b = {}
        for sampling in ("uniform", "auto-weighting"):
            (sampler,) = samplers(data, 1, 1, sampling)
            places = []
            for _ in range(6):
                records = [trace_record(m) for m in sampler]
                self.assertEqual(Counter(r["dataset"] for r in records), {"a": 40, "b": 13})
                places += [i / len(records) for i, r in enumerate(records) if r["dataset"] == "b"]
            mean_b[sampling] = np.mean(places)
        self.assertLess(mean_b["uniform"], 0.3)
        self.assertAlmostEqual(mean_b["auto-weighting"], 0.5, delta=0.1)

    def test_auto_weighting_is_the_schedule_of_runs_that_set_none(self):
        data = schedule_case.datasets(DatasetSchedule(probability=0.4, start_step=3))
        default = [trace_record(m) for m in samplers(data, 1, 1, "auto-weighting")[0]]
        plain = [trace_record(m) for m in schedule_case.samplers(data, 1, 1)[0]]
        self.assertEqual(default, plain)
        self.assertNotIn("sampling", schedule_case.samplers(data, 1, 1)[0].fingerprint())


class UniformResumeTest(unittest.TestCase):
    def test_resuming_at_any_position_continues_the_same_sequence(self):
        data = schedule_case.datasets(DatasetSchedule(probability=0.5, start_step=9), batch=2)
        full = schedule_case.traces(samplers(data, 2, 2, "uniform"), 3)
        for rank in range(2):
            for cut in (0, 5, len(full[rank]) // 2, len(full[rank]) - 1):
                with self.subTest(rank=rank, cut=cut):
                    before = full[rank][cut]
                    resumed = samplers(data, 2, 2, "uniform")[rank]
                    resumed.load_state_dict({"epoch": before["epoch"], "step": before["step"],
                                             "fingerprint": resumed.fingerprint()})
                    rest = [trace_record(m) for _ in range(3 - before["epoch"])
                            for m in resumed]
                    self.assertEqual(rest, full[rank][cut:])

    def test_a_changed_method_is_named_in_the_resume_warning(self):
        data = schedule_case.datasets(DatasetSchedule())
        state = samplers(data, 1, 1, "auto-weighting")[0].state_dict()
        (resumed,) = samplers(data, 1, 1, "uniform")
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "WARNING") as logs:
            resumed.load_state_dict(state)
        self.assertIn("sampling added", logs.output[0])


class PlanShowsTheMethodTest(unittest.TestCase):
    def test_the_schedule_table_names_it(self):
        entry = {"probability": 1.0, "share": 0.5, "start_epoch": 1, "start_step": 0,
                 "end_epoch": None, "end_step": None, "is_regularisation_data": False,
                 "joins": None}
        table = schedule_table({"a": {**entry, "sampling": "uniform"},
                                "b": {**entry, "sampling": "uniform"}}, 2, 1)
        self.assertIn("data_backend_sampling uniform", table.splitlines()[0])
        self.assertIn("50.0% of the odds per step while it has groups left", table)


if __name__ == "__main__":
    unittest.main()
