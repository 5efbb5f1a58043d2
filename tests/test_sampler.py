"""MultiAspectSampler: lockstep schedule, per-sample fields, resume and the fingerprint warning."""

from __future__ import annotations

import json
import unittest
from collections import Counter

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.split import UndersizedBucketsError
from simpletuner.helpers.multiaspect.sampler import (MultiAspectSampler, NoDatasetError,
                                                    SamplerDataset)


def ids(n: int, prefix: str) -> list[str]:
    return [f"{prefix}/{i:04d}.png" for i in range(n)]


def two_datasets(batch_a: int = 2, batch_b: int = 1, repeats_b: int = 1, tail: str = "trim"):
    a = DatasetIndex("alpha", {"64x64": ids(41, "sq"), "64x128": ids(23, "tall"),
                               "128x64": ids(17, "wide")}, {})
    b = DatasetIndex("beta", {"64x64": ids(13, "b")}, {})
    return [SamplerDataset(a, lambda s: f"caption of {s}", batch_a, bucket_tail=tail),
            SamplerDataset(b, lambda s: "beta", batch_b, repeats=repeats_b, bucket_tail=tail)]


def sampler(datasets, rank=0, processes=3, accumulation=2, seed=99):
    return MultiAspectSampler(datasets, seed=seed, processes=processes, rank=rank,
                              accumulation=accumulation)


def as_plain(batches):
    return [(m.epoch, m.step, m.dataset_id, m.bucket, [s.sample_id for s in m.samples])
            for m in batches]


class LockstepTest(unittest.TestCase):
    def test_all_ranks_same_bucket_per_step_and_same_count(self):
        datasets = two_datasets()
        runs = [list(sampler(datasets, rank=r)) for r in range(3)]
        self.assertEqual(len({len(run) for run in runs}), 1)
        self.assertGreater(len(runs[0]), 0)
        self.assertEqual(len(runs[0]) % 2, 0)
        for step, batches in enumerate(zip(*runs)):
            self.assertEqual(len({(m.dataset_id, m.bucket) for m in batches}), 1, step)
            self.assertEqual({m.step for m in batches}, {step})
        # A shared schedule interleaves buckets rather than running them one after another.
        keys = [(m.dataset_id, m.bucket) for m in runs[0]]
        changes = sum(1 for x, y in zip(keys, keys[1:]) if x != y)
        self.assertGreater(changes, len(set(keys)))

    def test_exactly_once_per_epoch_across_ranks_with_repeats(self):
        datasets = two_datasets()
        samplers = [sampler(datasets, rank=r) for r in range(3)]
        for epoch in range(3):
            got = Counter((m.dataset_id, s.sample_id) for sm in samplers for m in sm
                          for s in m.samples)
            trimmed = Counter((p.dataset_id, x) for p in samplers[0].slices(epoch)
                              for x in p.trimmed)
            expected = Counter({("alpha", x): 1 for d in datasets[:1]
                                for v in d.index.buckets.values() for x in v})
            expected.update({("beta", x): 2 for x in ids(13, "b")})
            self.assertEqual(got + trimmed, expected, f"epoch {epoch}")

    def test_carry_trains_every_occurrence_of_every_pass_once(self):
        # E = 12 for alpha (41, 23, 17 samples), 6 for beta (13 x 2 occurrences).
        datasets = two_datasets(tail="carry")
        samplers = [sampler(datasets, rank=r) for r in range(3)]
        one_pass = Counter({("alpha", x): 1 for v in datasets[0].index.buckets.values()
                            for x in v})
        one_pass.update({("beta", x): 2 for x in ids(13, "b")})
        trained, lengths = Counter(), []
        for epoch in range(4):
            runs = [list(sm) for sm in samplers]
            self.assertEqual(len({len(run) for run in runs}), 1, f"epoch {epoch}")
            lengths.append(len(runs[0]))
            trained.update((m.dataset_id, s.sample_id) for run in runs for m in run
                           for s in m.samples)
            carried = Counter((p.dataset_id, x) for p in samplers[0].slices(epoch)
                              for x in p.carried)
            # After epoch e, e+1 whole passes less what waits for the next epoch.
            self.assertEqual(trained + carried,
                             Counter({k: v * (epoch + 1) for k, v in one_pass.items()}))
        # Leftovers 5, 11, 5 (alpha) and 2 (beta) carried on: some epochs have a step more.
        self.assertGreater(len(set(lengths)), 1, lengths)

    def test_per_dataset_batch_size_and_sample_fields(self):
        s = sampler(two_datasets(batch_a=3, batch_b=1), processes=2, accumulation=1)
        seen = set()
        for m in s:
            want = 3 if m.dataset_id == "alpha" else 1
            self.assertEqual(len(m.samples), want)
            for sample in m.samples:
                self.assertEqual(sample.dataset_id, m.dataset_id)
                self.assertEqual(sample.bucket, m.bucket)
                w, h = (int(v) for v in m.bucket.split("x"))
                self.assertEqual(sample.target_size, (w, h))
                want_caption = "beta" if m.dataset_id == "beta" else f"caption of {sample.sample_id}"
                self.assertEqual(sample.caption, want_caption)
                self.assertTrue(sample.sample_id.startswith(
                    {"64x64": ("sq", "b"), "64x128": ("tall",), "128x64": ("wide",)}[m.bucket]))
            seen.add(m.dataset_id)
        self.assertEqual(seen, {"alpha", "beta"})

    def test_each_epoch_has_its_own_order(self):
        s = sampler(two_datasets())
        epoch0, epoch1 = as_plain(s), as_plain(s)
        self.assertEqual({e for e, *_ in epoch0}, {0})
        self.assertEqual({e for e, *_ in epoch1}, {1})
        self.assertEqual(len(epoch0), len(epoch1))
        self.assertNotEqual([x[2:] for x in epoch0], [x[2:] for x in epoch1])

    def test_undersized_bucket_raises_at_construction(self):
        small = DatasetIndex("small", {"64x64": ids(3, "s")}, {})
        with self.assertRaises(UndersizedBucketsError):
            sampler([SamplerDataset(small, str, 2)], processes=2, accumulation=1)

    def test_no_training_dataset_is_a_clear_error(self):
        only_eval = [SamplerDataset(DatasetIndex("held-out", {"64x64": ids(7, "e")}, {}), str, 1,
                                    evaluation=True)]
        with self.assertRaisesRegex(NoDatasetError, "no training dataset"):
            sampler(only_eval)

    def test_evaluation_sampler_uses_only_eval_datasets_one_sample_per_rank(self):
        datasets = two_datasets() + [SamplerDataset(
            DatasetIndex("held-out", {"64x64": ids(7, "e")}, {}), str, 4, evaluation=True)]
        runs = [list(MultiAspectSampler(datasets, seed=1, processes=3, rank=r, accumulation=4,
                                        evaluation=True)) for r in range(3)]
        # 7 samples on 3 ranks: 3 steps each; ranks 1 and 2 end with a stand-in.
        self.assertEqual([len(run) for run in runs], [3, 3, 3])
        self.assertEqual([[m.stand_in for m in run] for run in runs],
                         [[False] * 3, [False, False, True], [False, False, True]])
        self.assertTrue(all(len(m.samples) == 1 for run in runs for m in run))
        got = [s.sample_id for run in runs for m in run if not m.stand_in for s in m.samples]
        self.assertEqual(sorted(got), ids(7, "e"))


class ResumeTest(unittest.TestCase):
    def test_restored_sampler_yields_the_rest_of_the_uninterrupted_sequence(self):
        datasets = two_datasets()
        full = sampler(datasets, rank=1)
        uninterrupted = as_plain(full) + as_plain(full) + as_plain(full)
        per_epoch = len(uninterrupted) // 3
        for stop in (0, 1, 5, per_epoch - 1, per_epoch, per_epoch + 3, 2 * per_epoch + 1):
            first = sampler(datasets, rank=1)
            consumed = []
            while len(consumed) < stop:
                for m in first:
                    consumed.append(m)
                    if len(consumed) == stop:
                        break
            state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
            resumed = sampler(datasets, rank=1)
            with self.assertNoLogs("simpletuner.helpers.multiaspect.sampler", "WARNING"):
                resumed.load_state_dict(state)
            rest = []
            while resumed.epoch < 3:
                rest.extend(as_plain(resumed))
            with self.subTest(stop=stop):
                self.assertEqual(as_plain(consumed) + rest, uninterrupted)

    def test_state_dict_counts_handed_out_micro_batches(self):
        s = sampler(two_datasets())
        iterator = iter(s)
        next(iterator)
        next(iterator)
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["step"]), (0, 2))
        for _ in iterator:
            pass
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["step"]), (1, 0))


class PlanTest(unittest.TestCase):
    def test_plans_advance_like_iteration_and_read_no_caption(self):
        reads = []
        index = DatasetIndex("d", {"64x64": ids(20, "sq")}, {})
        counting = [SamplerDataset(index, lambda s: reads.append(s) or f"caption of {s}", 2)]
        planning, iterating = sampler(counting), sampler(counting)
        plans = [p for _ in range(2) for p in planning.plans()]
        self.assertEqual(reads, [])
        full = [m for _ in range(2) for m in iterating]
        self.assertEqual((planning.epoch, planning.step), (2, 0))
        self.assertEqual(planning.state_dict(), iterating.state_dict())
        self.assertEqual(plans, [m.without_captions() for m in full])
        self.assertEqual([planning.with_captions(p) for p in plans], full)
        self.assertTrue(all(s.caption is None for p in plans for s in p.samples))


class FingerprintTest(unittest.TestCase):
    def saved_state(self):
        return sampler(two_datasets()).state_dict()

    def warnings_on_load(self, other):
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "WARNING") as logs:
            other.load_state_dict(self.saved_state())
        self.assertEqual(len(logs.records), 1, "expected exactly one warning")
        return logs.records[0].getMessage()

    def test_world_size_change_is_named(self):
        message = self.warnings_on_load(sampler(two_datasets(), processes=2))
        self.assertIn("processes: 3 -> 2", message)
        self.assertIn("not supported", message)
        self.assertNotIn("seed", message)

    def test_batch_size_repeats_accumulation_seed_and_index_are_named(self):
        cases = [
            (sampler(two_datasets(batch_a=1)), "datasets.alpha.batch_size: 2 -> 1"),
            (sampler(two_datasets(repeats_b=2)), "datasets.beta.repeats: 1 -> 2"),
            (sampler(two_datasets(), accumulation=1), "accumulation: 2 -> 1"),
            (sampler(two_datasets(), seed=5), "seed: 99 -> 5"),
        ]
        changed = two_datasets()
        changed[1] = SamplerDataset(DatasetIndex("beta", {"64x64": ids(14, "b")}, {}),
                                    str, 1, repeats=1)
        cases.append((sampler(changed), "datasets.beta.index:"))
        renamed = two_datasets()[:1] + [SamplerDataset(
            DatasetIndex("gamma", {"64x64": ids(13, "b")}, {}), str, 1, repeats=1)]
        cases.append((sampler(renamed), "datasets.beta removed; datasets.gamma added"))
        cases.append((sampler(two_datasets(tail="carry")),
                      "datasets.alpha.bucket_tail: trim -> carry"))
        for other, needle in cases:
            with self.subTest(needle=needle):
                self.assertIn(needle, self.warnings_on_load(other))

    def test_a_state_saved_by_another_split_version_is_named(self):
        from simpletuner.helpers.metadata.split import SPLIT_VERSION
        state = self.saved_state()
        state["fingerprint"]["split_version"] = SPLIT_VERSION - 1
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "WARNING") as logs:
            sampler(two_datasets()).load_state_dict(state)
        self.assertIn(f"split_version: {SPLIT_VERSION - 1} -> {SPLIT_VERSION}",
                      logs.records[0].getMessage())

    def test_mismatch_keeps_the_saved_position(self):
        other = sampler(two_datasets(), processes=2)
        state = self.saved_state()
        state["step"] = 4
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "WARNING"):
            other.load_state_dict(state)
        self.assertEqual(next(iter(other)).step, 4)

    def test_unchanged_data_resumes_without_a_warning(self):
        state = json.loads(json.dumps(sampler(two_datasets()).state_dict()))
        with self.assertNoLogs("simpletuner.helpers.multiaspect.sampler", "WARNING"):
            sampler(two_datasets()).load_state_dict(state)


class StateSizeTest(unittest.TestCase):
    def test_the_state_does_not_grow_with_the_samples(self):
        def state_bytes(per_bucket: int) -> int:
            index = DatasetIndex("d", {"64x64": ids(per_bucket, "a"),
                                       "64x128": ids(per_bucket, "b")}, {})
            s = sampler([SamplerDataset(index, str, 1)], processes=2, accumulation=1)
            next(iter(s))
            return len(json.dumps(s.state_dict()))

        small, large = state_bytes(10), state_bytes(20_000)
        self.assertEqual(small, large)
        self.assertLess(large, 1024)


class TrimReportTest(unittest.TestCase):
    def test_main_rank_logs_each_epochs_trim_per_bucket(self):
        # E = 2 x 3 x 2 = 12 for alpha (41, 23, 17 samples), 1 x 3 x 2 = 6 for beta (13 x 2).
        s = sampler(two_datasets())
        for epoch in range(2):
            with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "INFO") as logs:
                list(s)
            self.assertEqual(len(logs.records), 1)
            message = logs.records[0].getMessage()
            self.assertIn(f"epoch {epoch}: the split trims 23 occurrences", message)
            self.assertIn("from 4 buckets: alpha 128x64: 5, alpha 64x128: 11, alpha 64x64: 5, "
                          "beta 64x64: 2", message)

    def test_other_ranks_stay_quiet(self):
        with self.assertNoLogs("simpletuner.helpers.multiaspect.sampler", "INFO"):
            list(sampler(two_datasets(), rank=1))

    def test_past_twenty_buckets_the_rest_are_counted(self):
        buckets = {f"{64 + 16 * i}x64": ids(5, f"k{i:02d}") for i in range(25)}
        many = [SamplerDataset(DatasetIndex("d", buckets, {}), str, 1, bucket_tail="trim")]
        message = sampler(many, processes=2, accumulation=1).tail_report(4)  # E = 2: 1 each
        self.assertIn("epoch 4: the split trims 25 occurrences", message)
        self.assertEqual(message.count(": 1"), 20)
        self.assertTrue(message.endswith(" and 5 more buckets"), message)

    def test_carry_names_what_goes_on_and_what_came_in(self):
        # E = 12: alpha carries 41 % 12 = 5, 23 % 12 = 11, 17 % 12 = 5 out of epoch 0 ...
        s = sampler(two_datasets(tail="carry"))
        self.assertIn("epoch 0: the split carries 23 occurrences (each bucket's remainder below a "
                      "multiple of the effective batch) into epoch 1 from 4 buckets: alpha "
                      "128x64: 5, alpha 64x128: 11, alpha 64x64: 5, beta 64x64: 2",
                      s.tail_report(0))
        # ... and (5 + 17) % 12 = 10, (11 + 23) % 12 = 10, (5 + 41) % 12 = 10, (2 + 26) % 6 = 4
        # out of epoch 1, after training the 23 it carried in first.
        report = s.tail_report(1)
        self.assertIn("carries 34 occurrences", report)
        self.assertIn("alpha 128x64: 10, alpha 64x128: 10, alpha 64x64: 10, beta 64x64: 4",
                      report)
        self.assertTrue(report.endswith("; 23 occurrences carried from epoch 0 train first"),
                        report)
        self.assertNotIn("trims", report)

    def test_a_bucket_filling_whole_batches_trims_nothing(self):
        exact = [SamplerDataset(DatasetIndex("d", {"64x64": ids(12, "x")}, {}), str, 2,
                                bucket_tail="trim")]
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "INFO") as logs:
            list(sampler(exact))
        self.assertEqual(logs.records[0].getMessage(), "epoch 0: the split trims nothing")

    def test_under_carry_a_bucket_filling_whole_batches_says_nothing(self):
        # carry never trims: "the split trims nothing" every epoch would only be noise
        exact = [SamplerDataset(DatasetIndex("d", {"64x64": ids(12, "x")}, {}), str, 2,
                                bucket_tail="carry")]
        with self.assertNoLogs("simpletuner.helpers.multiaspect.sampler", "INFO"):
            list(sampler(exact))


if __name__ == "__main__":
    unittest.main()
