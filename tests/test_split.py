"""The split, every rank simulated in one process: exactly once, equal shares, independence.
``bucket_tail: trim`` here; carry and evaluation sets of any size: test_split_tail.py."""

from __future__ import annotations

import json
import math
import os
import random
import sys
import tempfile
import textwrap
import unittest
from collections import Counter

import numpy as np
import torch

from launching import run_bounded
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.split import (DatasetSpec, EffectiveBatch, SortedIds,
                                                UndersizedBucketsError, canonical_ids,
                                                check_bucket_sizes, split_bucket)
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset


def ids(n: int, prefix: str = "img") -> list[str]:
    return [f"{prefix}/{i:05d}.png" for i in range(n)]


def split_all(sample_ids, *, repeats, eff, epoch=0, seed=7, oversub=False, bucket="64x64",
              tail="trim"):
    """Every rank's slice of one bucket."""
    return [split_bucket(sample_ids, dataset_id="d", bucket=bucket, epoch=epoch, seed=seed,
                         repeats=repeats, effective=eff, rank=rank, tail=tail,
                         allow_oversubscription=oversub)
            for rank in range(eff.processes)]


def expected_trim(n: int, repeats: int, b: int, w: int, g: int, *,
                  oversub: bool = False) -> int:
    """docs/DESIGN.md's rule, derived here rather than read from the split: occurrences mod E, with
    E = B*W*G; oversubscription (no manual repeats) trims nothing."""
    e = b * w * g
    occurrences = n * (repeats + 1)
    if oversub and repeats == 0 and occurrences < e:
        return 0
    return occurrences % e


def min_repeats_brute_force(n: int, e: int) -> int:
    r = 0
    while n * (r + 1) < e:
        r += 1
    return r


class SplitGridTest(unittest.TestCase):
    """processes 1..8, batch 1..4, accumulation 1..3, repeats 0..2, sizes around E."""

    def check_bucket(self, sample_ids, repeats, eff, epoch, oversub):
        b, w, g = eff.batch_size, eff.processes, eff.accumulation
        n, e = len(sample_ids), b * w * g
        slices = split_all(sample_ids, repeats=repeats, eff=eff, epoch=epoch, oversub=oversub)
        lengths = {len(s.samples) for s in slices}
        self.assertEqual(len(lengths), 1, "ranks got different numbers of samples")
        per_rank = lengths.pop()
        self.assertEqual(per_rank % (eff.batch_size * eff.accumulation), 0)
        micro = {s.micro_batches for s in slices}
        self.assertEqual(len(micro), 1)
        self.assertEqual(micro.pop() % eff.accumulation, 0)
        trimmed = slices[0].trimmed
        for s in slices[1:]:
            self.assertEqual(s.trimmed, trimmed, "ranks disagree on the trimmed occurrences")
        assigned = Counter()
        for s in slices:
            assigned.update(s.samples)
        total = sum(assigned.values())
        self.assertEqual(total % e, 0)
        if n * (repeats + 1) < e:  # only reachable with oversubscription and no repeats
            self.assertTrue(oversub and repeats == 0)
            self.assertEqual(total, e)
            self.assertEqual(trimmed, [])
            self.assertEqual(set(assigned), set(sample_ids))
            self.assertLessEqual(max(assigned.values()) - min(assigned.values()), 1)
            return
        self.assertEqual(len(trimmed), expected_trim(n, repeats, b, w, g, oversub=oversub))
        expected = Counter({s: repeats + 1 for s in sample_ids})
        self.assertEqual(assigned + Counter(trimmed), expected)
        self.assertEqual(total, n * (repeats + 1) - len(trimmed))

    def test_grid(self):
        for w in range(1, 9):
            for b in range(1, 5):
                for g in range(1, 4):
                    with self.subTest(w=w, b=b, g=g):
                        self.check_config(w, b, g)

    def check_config(self, w, b, g):
        eff = EffectiveBatch.for_dataset(b, w, g)
        e = b * w * g
        for repeats in range(3):
            copies = repeats + 1
            sizes = {1, 2, 7, 13, max(1, e // copies - 1), math.ceil(e / copies),
                     math.ceil(e / copies) + 1, e + 3, 2 * e + 5}
            for n in sorted(sizes):
                # Oversubscription changes nothing for a bucket that fills E; test it where it acts.
                for oversub in (False, True) if n * copies < e else (False,):
                    spec = DatasetSpec("d", {"64x64": ids(n)}, repeats, b,
                                       allow_oversubscription=oversub)
                    where = f"repeats={repeats} n={n} oversubscription={oversub}"
                    if n * copies < e and not (oversub and repeats == 0):
                        with self.assertRaises(UndersizedBucketsError, msg=where) as ctx:
                            check_bucket_sizes([spec], w, g)
                        need = min_repeats_brute_force(n, e)
                        self.assertIn(f"needs repeats >= {need}", str(ctx.exception))
                        continue
                    check_bucket_sizes([spec], w, g)
                    for epoch in (0, 3):
                        self.check_bucket(ids(n), repeats, eff, epoch, oversub)

    def test_micro_batch_j_is_one_step_of_the_global_batch(self):
        # Micro-batch j of all ranks together is one block of B*W consecutive permuted
        # occurrences: no occurrence is shared between ranks within a step.
        eff = EffectiveBatch.for_dataset(3, 4, 2)
        slices = split_all(ids(50), repeats=0, eff=eff)
        for j in range(slices[0].micro_batches):
            together = [x for s in slices for x in s.micro_batch(j)]
            self.assertEqual(len(together), 12)
            self.assertEqual(len(set(together)), 12)

    def test_permutation_and_trim_change_per_epoch(self):
        eff = EffectiveBatch.for_dataset(4, 3, 1)
        sample_ids = ids(53)  # 53 = 4*12 + 5: five trimmed per epoch
        trims, firsts = set(), set()
        for epoch in range(6):
            slices = split_all(sample_ids, repeats=0, eff=eff, epoch=epoch)
            self.assertEqual(len(slices[0].trimmed), 5)
            trims.add(tuple(sorted(slices[0].trimmed)))
            firsts.add(tuple(slices[0].samples))
        self.assertGreater(len(trims), 1, "the same samples are trimmed every epoch")
        self.assertEqual(len(firsts), 6, "rank 0 got the same order in two epochs")

    def test_seed_dataset_and_bucket_each_change_the_permutation(self):
        eff = EffectiveBatch.for_dataset(2, 2, 1)
        base = split_bucket(ids(40), dataset_id="d", bucket="64x64", epoch=0, seed=1,
                            repeats=0, effective=eff, rank=0, tail="trim").samples
        for change in ({"seed": 2}, {"dataset_id": "e"}, {"bucket": "64x128"}):
            args = dict(dataset_id="d", bucket="64x64", epoch=0, seed=1)
            args.update(change)
            other = split_bucket(ids(40), repeats=0, effective=eff, rank=0, tail="trim",
                                 **args).samples
            self.assertNotEqual(other, base, change)

    def test_a_bucket_large_enough_for_the_feistel_shuffle_is_split_exactly_once(self):
        from simpletuner.helpers.metadata.permutation import FEISTEL_FROM
        eff = EffectiveBatch.for_dataset(2, 3, 2)
        sample_ids = ids(FEISTEL_FROM // 2 + 7)
        slices = split_all(sample_ids, repeats=1, eff=eff)
        self.assertGreaterEqual(slices[0].counts.occurrences, FEISTEL_FROM)
        self.assertEqual({len(s.samples) for s in slices}, {slices[0].counts.kept // 3})
        seen = Counter(x for s in slices for x in s.samples) + Counter(slices[0].trimmed)
        self.assertEqual(seen, Counter({x: 2 for x in sample_ids}))
        self.assertEqual(len(slices[0].trimmed), expected_trim(len(sample_ids), 1, 2, 3, 2))
        # micro-batch j of each rank is its j-th group of batch_size samples
        self.assertEqual(slices[1].micro_batch(5), slices[1].samples[10:12])

    def test_duplicate_ids_in_a_bucket_are_rejected(self):
        eff = EffectiveBatch.for_dataset(1, 2, 1)
        with self.assertRaises(ValueError):
            split_all(["b.png", "a.png", "b.png", "c.png"], repeats=0, eff=eff)


class IndependenceTest(unittest.TestCase):
    def test_listing_order_does_not_matter(self):
        eff = EffectiveBatch.for_dataset(2, 3, 2)
        sample_ids = ids(61)
        expected = [(s.samples, s.trimmed) for s in split_all(sample_ids, repeats=1, eff=eff)]
        shuffler = random.Random(3)
        for _ in range(3):
            shuffled = list(sample_ids)
            shuffler.shuffle(shuffled)
            got = [(s.samples, s.trimmed) for s in split_all(shuffled, repeats=1, eff=eff)]
            self.assertEqual(got, expected)

    def test_an_index_puts_its_buckets_in_canonical_order_once(self):
        shuffled = ids(30)
        random.Random(4).shuffle(shuffled)
        index = DatasetIndex("d", {"64x64": shuffled, "64x128": ids(5, "t")}, {})
        for key, bucket in index.buckets.items():
            self.assertIsInstance(bucket, SortedIds)
            self.assertEqual(bucket, sorted(bucket))
            self.assertIs(canonical_ids(bucket), bucket)  # the split does not check it again
        self.assertEqual(index.buckets["64x64"], ids(30))
        in_order = DatasetIndex("d", {"64x128": ids(5, "t"), "64x64": ids(30)}, {})
        self.assertEqual(in_order.digest(), index.digest())
        with self.assertRaises(ValueError):
            DatasetIndex("d", {"64x64": ["b.png", "a.png", "b.png"]}, {})
        smaller = index.without({ids(30)[3]: "gone"})
        self.assertIsInstance(smaller.buckets["64x64"], SortedIds)
        self.assertEqual(smaller.buckets["64x64"], ids(30)[:3] + ids(30)[4:])

    def test_global_rngs_are_neither_used_nor_advanced(self):
        eff = EffectiveBatch.for_dataset(2, 4, 1)
        results = []
        for value in (0, 1, 987654):
            random.seed(value)
            np.random.seed(value)
            torch.manual_seed(value)
            before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
            results.append([s.samples for s in split_all(ids(37), repeats=2, eff=eff)])
            self.assertEqual(random.getstate(), before[0])
            self.assertTrue(np.array_equal(np.random.get_state()[1], before[1]))
            self.assertTrue(torch.equal(torch.get_rng_state(), before[2]))
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[0], results[2])

    def test_pythonhashseed_does_not_matter(self):
        script = textwrap.dedent("""
            import json
            from simpletuner.helpers.metadata.split import EffectiveBatch, split_bucket
            names = sorted({f"photo-{i}.jpg" for i in range(45)}, key=hash)  # hash-ordered input
            eff = EffectiveBatch.for_dataset(2, 3, 2)
            out = [split_bucket(names, dataset_id="d", bucket="64x96", epoch=1, seed=11,
                                repeats=1, effective=eff, rank=r, tail="carry").samples
                   for r in range(3)]
            print(json.dumps(out))
        """)
        outputs = set()
        for hash_seed in ("0", "1", "4242"):
            env = {**os.environ, "PYTHONHASHSEED": hash_seed}
            with tempfile.TemporaryDirectory(prefix="st-split-") as tmp:
                done = run_bounded([sys.executable, "-c", script], tmpdir=tmp, env=env, timeout=60)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            outputs.add(done.stdout)
        self.assertEqual(len(outputs), 1, "the split depends on PYTHONHASHSEED")
        # carry: 90 occurrences, 6 carried in from epoch 0, 96 kept over 3 ranks
        self.assertEqual(len(json.loads(outputs.pop())[0]), 32)


class UpstreamEdgeCaseTest(unittest.TestCase):
    def test_bucket_large_enough_only_thanks_to_repeats_is_accepted(self):
        # 3 samples, E = 2 x 3 x 1 = 6: too small alone, exactly one effective batch with repeats 1.
        spec = DatasetSpec("d", {"64x64": ids(3)}, repeats=1, batch_size=2)
        self.assertEqual(check_bucket_sizes([spec], 3, 1), [])
        slices = split_all(ids(3), repeats=1, eff=spec.effective_batch(3, 1))
        self.assertEqual([len(s.samples) for s in slices], [2, 2, 2])
        together = Counter(x for s in slices for x in s.samples)
        self.assertEqual(together, Counter({x: 2 for x in ids(3)}))
        self.assertEqual(slices[0].trimmed, [])

    def test_eval_dataset_ignores_gradient_accumulation(self):
        # Training E would be 2 x 4 x 3 = 24 > 5 samples; evaluation steps one sample per rank.
        train = DatasetSpec("t", {"64x64": ids(5)}, batch_size=2)
        with self.assertRaises(UndersizedBucketsError):
            check_bucket_sizes([train], 4, 3)
        evaluation = DatasetSpec("t", {"64x64": ids(5)}, batch_size=2, evaluation=True)
        eff = evaluation.effective_batch(4, 3)
        self.assertEqual((eff.batch_size, eff.accumulation), (1, 1))
        self.assertEqual(check_bucket_sizes([evaluation], 4, 3), [])
        slices = split_all(ids(5), repeats=0, eff=eff)
        # 5 samples on 4 ranks: two steps each, rank 0 alone has a real second one.
        self.assertEqual([len(s.samples) for s in slices], [2, 1, 1, 1])
        self.assertEqual({s.micro_batches for s in slices}, {2})
        self.assertEqual(slices[0].trimmed, [])
        self.assertEqual(Counter(x for s in slices for x in s.samples), Counter(ids(5)))

    def test_oversubscription_extends_only_undersized_buckets(self):
        small, big = ids(3, "s"), ids(50, "b")
        spec = DatasetSpec("d", {"64x64": small, "64x128": big}, batch_size=2,
                           allow_oversubscription=True)
        notes = check_bucket_sizes([spec], 4, 1)  # E = 8
        self.assertEqual(len(notes), 1)
        self.assertIn("64x64", notes[0])
        self.assertIn("extended", notes[0])
        eff = spec.effective_batch(4, 1)
        small_slices = split_all(small, repeats=0, eff=eff, oversub=True)
        got = Counter(x for s in small_slices for x in s.samples)
        self.assertEqual(sum(got.values()), 8)
        self.assertEqual(sorted(got.values()), [2, 3, 3])
        big_slices = split_all(big, repeats=0, eff=eff, oversub=True, bucket="64x128")
        got = Counter(x for s in big_slices for x in s.samples)
        self.assertEqual(sum(got.values()), 48)
        self.assertEqual(max(got.values()), 1, "a big bucket was oversubscribed")
        self.assertEqual(len(big_slices[0].trimmed), 2)

    def test_oversubscription_does_not_override_manual_repeats(self):
        spec = DatasetSpec("d", {"64x64": ids(3)}, repeats=1, batch_size=2,
                           allow_oversubscription=True)
        with self.assertRaises(UndersizedBucketsError) as ctx:
            check_bucket_sizes([spec], 4, 1)
        self.assertIn("set by hand (1)", str(ctx.exception))


class UndersizedErrorTest(unittest.TestCase):
    def test_one_error_names_everything_and_is_the_same_everywhere(self):
        photos = DatasetSpec("photos", {"64x64": ids(30), "64x128": ids(5), "128x64": ids(7)},
                             repeats=1, batch_size=4)
        tiny = DatasetSpec("tiny", {"64x64": ids(2)}, batch_size=1)
        fine = DatasetSpec("fine", {"64x64": ids(200)}, batch_size=4)
        with self.assertRaises(UndersizedBucketsError) as ctx:
            check_bucket_sizes([photos, tiny, fine], 3, 2)
        text = str(ctx.exception)
        for needle in ("'photos'", "E = 24 (train_batch_size 4 x 3 processes x 2 "
                       "gradient_accumulation_steps)", "42 samples and 84 occurrences",
                       "bucket 64x128: 5 samples x 2 = 10 occurrences; needs repeats >= 4",
                       "bucket 128x64: 7 samples x 2 = 14 occurrences; needs repeats >= 3",
                       "'tiny'", "E = 6 (train_batch_size 1 x 3 processes",
                       "needs repeats >= 2", "smaller train_batch_size",
                       "fewer gradient_accumulation_steps", "fewer processes", "'repeats'",
                       "more images", "allow_dataset_oversubscription: true"):
            self.assertIn(needle, text)
        self.assertNotIn("'fine'", text)
        self.assertNotIn("bucket 64x64: 30", text)
        # Another rank may list buckets in another order; the message must not change.
        reordered = DatasetSpec("photos", dict(reversed(list(photos.buckets.items()))),
                                repeats=1, batch_size=4)
        with self.assertRaises(UndersizedBucketsError) as again:
            check_bucket_sizes([reordered, tiny, fine], 3, 2)
        self.assertEqual(str(again.exception), text)

    def test_empty_dataset_is_an_error(self):
        with self.assertRaises(UndersizedBucketsError) as ctx:
            check_bucket_sizes([DatasetSpec("empty", {})], 1, 1)
        self.assertIn("'empty' has no usable samples", str(ctx.exception))
        # The fixes for too-small buckets (batch size, repeats, ...) do not apply to no images.
        self.assertNotIn("Fixes", str(ctx.exception))


class SamplerLockstepGridTest(unittest.TestCase):
    """Every rank's sampler: same bucket per step, same length, exactly once per epoch."""

    def test_grid(self):
        for w in range(1, 9):
            for b in range(1, 5):
                for g in range(1, 4):
                    e = w * g
                    first = DatasetIndex("a", {"64x64": ids(7 * b * e + 3, "a"),
                                               "64x128": ids(2 * b * e + 1, "b"),
                                               "128x64": ids(b * e, "c")}, {})
                    second = DatasetIndex("b", {"64x64": ids(3 * e + 2, "d")}, {})
                    datasets = [SamplerDataset(first, str, b, bucket_tail="trim"),
                                SamplerDataset(second, str, 1, repeats=2, bucket_tail="trim")]
                    with self.subTest(w=w, b=b, g=g):
                        self.check(datasets, w, g)

    def check(self, datasets, w, g):
        samplers = [MultiAspectSampler(datasets, seed=5, processes=w, rank=r, accumulation=g)
                    for r in range(w)]
        for epoch in range(2):
            runs = [list(s) for s in samplers]
            self.assertEqual(len({len(run) for run in runs}), 1)
            self.assertEqual(len(runs[0]) % g, 0)
            for step in range(len(runs[0])):
                keys = {(run[step].dataset_id, run[step].bucket) for run in runs}
                self.assertEqual(len(keys), 1, f"ranks disagree on the bucket at step {step}")
            for start in range(0, len(runs[0]), g):
                self.assertEqual(len({(m.dataset_id, m.bucket)
                                      for m in runs[0][start:start + g]}), 1,
                                 "an optimizer step mixes buckets")
            got = Counter((m.dataset_id, s.sample_id) for run in runs for m in run
                          for s in m.samples)
            pieces = samplers[0].slices(epoch)
            trimmed = Counter((piece.dataset_id, x) for piece in pieces for x in piece.trimmed)
            for d in datasets:
                for key, sample_ids in d.index.buckets.items():
                    piece = next(p for p in pieces
                                 if (p.dataset_id, p.bucket) == (d.index.dataset_id, key))
                    self.assertEqual(len(piece.trimmed), expected_trim(
                        len(sample_ids), d.repeats, d.batch_size, w, g))
            expected = Counter()
            for d in datasets:
                for sample_ids in d.index.buckets.values():
                    expected.update({(d.index.dataset_id, x): d.repeats + 1 for x in sample_ids})
            self.assertEqual(got + trimmed, expected)


if __name__ == "__main__":
    unittest.main()
