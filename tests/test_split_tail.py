"""bucket_tail carry and evaluation sets of any size, every rank simulated in one process.

Carry: over epochs 0..k-1 every occurrence of every pass is trained exactly once, the carried
ones at the front of the next epoch, and only the last epoch's carry (fewer than E) is left.
Evaluation: every occurrence once over the ranks, every rank the same number of micro-batches.
The expected counts are derived here, epoch by epoch, not read from the split.
"""

from __future__ import annotations

import math
import unittest
from collections import Counter

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.permutation import FEISTEL_FROM
from simpletuner.helpers.metadata.split import EffectiveBatch, split_bucket
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

EPOCHS = 4


def ids(n: int, prefix: str = "img") -> list[str]:
    return [f"{prefix}/{i:05d}.png" for i in range(n)]


def split_all(sample_ids, *, repeats, eff, epoch, tail="carry", bucket="64x64"):
    return [split_bucket(sample_ids, dataset_id="d", bucket=bucket, epoch=epoch, seed=3,
                         repeats=repeats, effective=eff, rank=rank, tail=tail)
            for rank in range(eff.processes)]


class CarryGridTest(unittest.TestCase):
    """processes 1..8, batch 1..4, accumulation 1..3, repeats 0..2, sizes from E up."""

    def test_grid(self):
        for w in range(1, 9):
            for b in range(1, 5):
                for g in range(1, 4):
                    e = b * w * g
                    for repeats in range(3):
                        copies = repeats + 1
                        for n in sorted({math.ceil(e / copies), math.ceil(e / copies) + 1,
                                         e + 3, 2 * e + 5, 13 * copies + e}):
                            with self.subTest(w=w, b=b, g=g, repeats=repeats, n=n):
                                self.check_passes(ids(n), repeats,
                                                  EffectiveBatch.for_dataset(b, w, g))

    def check_passes(self, sample_ids, repeats, eff):
        one_pass = Counter({s: repeats + 1 for s in sample_ids})
        occurrences, e = len(sample_ids) * (repeats + 1), eff.total
        trained, carried_in, left = Counter(), Counter(), 0
        for epoch in range(EPOCHS):
            slices = split_all(sample_ids, repeats=repeats, eff=eff, epoch=epoch)
            self.check_lockstep(slices, eff)
            assigned = Counter(x for s in slices for x in s.samples)
            carried = Counter(slices[0].carried)
            for s in slices[1:]:
                self.assertEqual(s.carried, slices[0].carried, "ranks disagree on the carry")
            left = (left + occurrences) % e  # what this epoch cannot fill into whole batches
            self.assertEqual(sum(carried.values()), left, f"epoch {epoch}")
            self.assertEqual(slices[0].trimmed, [])
            # This epoch: what came in, then its own pass less what it carries on.
            self.assertEqual(assigned + carried, one_pass + carried_in, f"epoch {epoch}")
            self.check_front(slices, carried_in, eff)
            trained += assigned
            carried_in = carried
        passes = Counter({s: EPOCHS * n for s, n in one_pass.items()})
        self.assertEqual(trained + carried_in, passes)
        self.assertLess(sum(carried_in.values()), e)

    def check_lockstep(self, slices, eff):
        micro = {s.micro_batches for s in slices}
        self.assertEqual(len(micro), 1, "ranks got different numbers of micro-batches")
        self.assertEqual(micro.pop() % eff.accumulation, 0)
        self.assertTrue(all(s.counted == len(s.occurrences) for s in slices))

    def check_front(self, slices, carried_in, eff):
        """The carried-in occurrences are the first ones of the epoch's order."""
        first = math.ceil(sum(carried_in.values()) / (eff.batch_size * eff.processes))
        opening = Counter(x for s in slices for j in range(first) for x in s.micro_batch(j))
        self.assertEqual(carried_in - opening, Counter(), "a carried occurrence trains late")

    def test_a_large_bucket_carries_through_the_feistel_shuffle(self):
        eff = EffectiveBatch.for_dataset(4, 3, 2)  # E = 24
        self.check_passes(ids(FEISTEL_FROM + 5), 0, eff)

    def test_trim_drops_what_carry_keeps(self):
        # The case: 100 images, batch 2, 8 processes: E = 16, 100 = 6 x 16 + 4.
        eff = EffectiveBatch.for_dataset(2, 8, 1)
        for tail, lost_per_epoch in (("trim", 4), ("carry", 0)):
            trained = Counter()
            for epoch in range(5):
                slices = split_all(ids(100), repeats=0, eff=eff, epoch=epoch, tail=tail)
                trained.update(x for s in slices for x in s.samples)
                self.assertEqual(len(slices[0].trimmed), lost_per_epoch)
            # carry: 5 x 100 = 500 = 31 x 16 + 4, only the last epoch's 4 wait.
            self.assertEqual(sum(trained.values()), 480 if tail == "trim" else 496)


class CarrySamplerGridTest(unittest.TestCase):
    """Several buckets and datasets through every rank's sampler: lockstep and exactly once
    per pass, with epochs of different lengths."""

    def test_grid(self):
        for w in range(1, 9):
            for b in range(1, 4):
                for g in range(1, 4):
                    e = b * w * g
                    first = DatasetIndex("a", {"64x64": ids(3 * e + 5, "a"),
                                               "64x128": ids(e + 1, "b"),
                                               "128x64": ids(2 * e - 1, "c")}, {})
                    second = DatasetIndex("b", {"64x64": ids(w * g + 3, "d")}, {})
                    datasets = [SamplerDataset(first, str, b, bucket_tail="carry"),
                                SamplerDataset(second, str, 1, repeats=2, bucket_tail="carry")]
                    with self.subTest(w=w, b=b, g=g):
                        self.check(datasets, w, g)

    def check(self, datasets, w, g):
        samplers = [MultiAspectSampler(datasets, seed=5, processes=w, rank=r, accumulation=g)
                    for r in range(w)]
        one_pass = Counter({(d.index.dataset_id, x): d.repeats + 1 for d in datasets
                            for v in d.index.buckets.values() for x in v})
        trained = Counter()
        for epoch in range(EPOCHS):
            runs = [list(s) for s in samplers]
            self.assertEqual(len({len(run) for run in runs}), 1)
            self.assertEqual(len(runs[0]), samplers[0].micro_batches_in(epoch))
            for start in range(0, len(runs[0]), g):
                keys = {(m.dataset_id, m.bucket) for run in runs for m in run[start:start + g]}
                self.assertEqual(len(keys), 1, f"epoch {epoch}: a step mixes buckets or ranks")
            trained.update((m.dataset_id, s.sample_id) for run in runs for m in run
                           for s in m.samples)
            waiting = Counter((p.dataset_id, x) for p in samplers[0].slices(epoch)
                              for x in p.carried)
            self.assertEqual(trained + waiting,
                             Counter({k: n * (epoch + 1) for k, n in one_pass.items()}))


class EvaluationGridTest(unittest.TestCase):
    """Evaluation sets of every size from 1 on 1..8 processes: each occurrence once."""

    def test_grid(self):
        for w in range(1, 9):
            for repeats in range(2):
                for n in range(1, 2 * w + 4):
                    with self.subTest(w=w, repeats=repeats, n=n):
                        self.check(ids(n), repeats, w)

    def check(self, sample_ids, repeats, w):
        eff = EffectiveBatch.for_dataset(4, w, 3, evaluation=True)
        occurrences = len(sample_ids) * (repeats + 1)
        slices = split_all(sample_ids, repeats=repeats, eff=eff, epoch=0)
        steps = math.ceil(occurrences / w)
        self.assertEqual([s.micro_batches for s in slices], [steps] * w)
        counted = Counter(x for s in slices for x in s.samples)
        self.assertEqual(counted, Counter({s: repeats + 1 for s in sample_ids}))
        for s in slices:
            flags = [s.is_stand_in(j) for j in range(s.micro_batches)]
            self.assertEqual(flags, sorted(flags), "a stand-in before a counted micro-batch")
            self.assertTrue(all(len(s.micro_batch(j)) == 1 for j in range(s.micro_batches)))
            self.assertTrue(set(s.micro_batch(steps - 1)) <= set(sample_ids))
        self.assertEqual(sum(s.is_stand_in(steps - 1) for s in slices), steps * w - occurrences)
        self.assertEqual((slices[0].trimmed, slices[0].carried), ([], []))

    def test_two_images_on_eight_processes_through_the_sampler(self):
        held = SamplerDataset(DatasetIndex("held", {"64x64": ids(1, "h"), "64x128": ids(1, "t")},
                                           {}), str, 2, evaluation=True)
        train = SamplerDataset(DatasetIndex("train", {"64x64": ids(16)}, {}), str, 2)
        runs = [list(MultiAspectSampler([train, held], seed=1, processes=8, rank=r,
                                        accumulation=2, evaluation=True)) for r in range(8)]
        self.assertEqual({len(run) for run in runs}, {2})  # one step per bucket, on every rank
        for step in range(2):
            self.assertEqual(len({run[step].bucket for run in runs}), 1)
        counted = Counter(s.sample_id for run in runs for m in run if not m.stand_in
                          for s in m.samples)
        self.assertEqual(counted, Counter({"h/00000.png": 1, "t/00000.png": 1}))
        self.assertEqual(sum(m.stand_in for run in runs for m in run), 14)


if __name__ == "__main__":
    unittest.main()
