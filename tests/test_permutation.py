"""The permutations every rank slices: the fast argsort must give exactly the stable argsort's
order, ties included, and the Feistel shuffle for large buckets must be a bijection that is
evaluated identically at any subset of positions and well spread."""

from __future__ import annotations

import hashlib
import json
import unittest

import numpy as np

from simpletuner.helpers.metadata.permutation import (FEISTEL_FROM, FEISTEL_ROUNDS,
                                                      StableShuffle, stable_argsort,
                                                      stable_argsort_tail, stable_permutation,
                                                      stable_seed)
from simpletuner.helpers.metadata.split import SPLIT_VERSION, EffectiveBatch, split_bucket


class StableArgsortTest(unittest.TestCase):
    def test_distinct_keys_match_the_stable_sort(self):
        for n in (0, 1, 2, 17, 1000, 100_003):
            with self.subTest(n=n):
                keys = np.random.PCG64(n).random_raw(n)
                np.testing.assert_array_equal(stable_argsort(keys),
                                              np.argsort(keys, kind="stable"))

    def test_equal_keys_keep_their_input_order(self):
        keys = np.array([3, 1, 3, 1, 2, 3, 0, 1], dtype=np.uint64)
        self.assertEqual(stable_argsort(keys).tolist(), [6, 1, 3, 7, 4, 0, 2, 5])

    def test_many_ties_match_the_stable_sort(self):
        keys = np.random.default_rng(0).integers(0, 5, size=10_000).astype(np.uint64)
        np.testing.assert_array_equal(stable_argsort(keys), np.argsort(keys, kind="stable"))

    def test_the_tail_alone_is_the_stable_sorts_tail_ties_included(self):
        rng = np.random.default_rng(1)
        for keys in (np.random.PCG64(3).random_raw(1000),
                     rng.integers(0, 4, size=50).astype(np.uint64),  # ties at every boundary
                     np.array([5, 9, 9, 1, 9, 7], dtype=np.uint64)):
            for count in sorted({0, 1, 2, 3, len(keys) // 2, len(keys) - 1, len(keys)}):
                with self.subTest(n=len(keys), count=count):
                    np.testing.assert_array_equal(
                        stable_argsort_tail(keys, count),
                        np.argsort(keys, kind="stable")[len(keys) - count:])

    def test_a_shuffles_tail_is_its_last_positions(self):
        for n in (40, FEISTEL_FROM + 3):
            for count in (0, 1, 17):
                with self.subTest(n=n, count=count):
                    whole = StableShuffle(n, 7, "ds", "64x64", 2)
                    np.testing.assert_array_equal(
                        StableShuffle.tail(n, count, 7, "ds", "64x64", 2),
                        whole.at(np.arange(n - count, n)))

    def test_permutation_is_the_stable_order_of_the_seeded_stream(self):
        n = 5000
        keys = np.random.PCG64(stable_seed(7, "ds", "64x64", 3)).random_raw(n)
        np.testing.assert_array_equal(stable_permutation(n, 7, "ds", "64x64", 3),
                                      np.argsort(keys, kind="stable"))



def reference_feistel_value(n: int, position: int, keys: list[int]) -> int:
    """The documented construction in plain Python integers (mod 2**64), one position at a
    time: an independent check of numpy's uint64 arithmetic (wrapping multiply, shifts)."""
    mask64 = (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask64
        return z ^ (z >> 31)

    bits = (n - 1).bit_length()
    value = position
    while True:
        left_bits, right_bits = bits - bits // 2, bits // 2
        left, right = value >> right_bits, value & ((1 << right_bits) - 1)
        for key in keys:
            left, right = right, left ^ (mix(right ^ key) & ((1 << left_bits) - 1))
            left_bits, right_bits = right_bits, left_bits
        value = (left << right_bits) | right
        if value < n:
            return value


class StableShuffleTest(unittest.TestCase):
    SIZES = (FEISTEL_FROM, FEISTEL_FROM + 1, 100_003, (1 << 17) + 5)

    def test_large_shuffles_are_bijections(self):
        for n in self.SIZES:
            with self.subTest(n=n):
                values = StableShuffle(n, 7, "ds", "64x64", 0).at(np.arange(n))
                np.testing.assert_array_equal(np.sort(values), np.arange(n))

    def test_any_subset_of_positions_gives_the_same_values(self):
        n = 100_003
        full = StableShuffle(n, 1, "d", "b", 2).at(np.arange(n))
        positions = np.random.default_rng(0).choice(n, size=5000, replace=False)
        np.testing.assert_array_equal(StableShuffle(n, 1, "d", "b", 2).at(positions),
                                      full[positions])
        np.testing.assert_array_equal(StableShuffle(n, 1, "d", "b", 2).at(np.arange(0, n, 7)),
                                      full[::7])

    def test_numpy_arithmetic_matches_the_plain_integer_construction(self):
        n, parts = 100_003, (5, "ds", "64x64", 1)
        digest = hashlib.sha512(json.dumps(list(parts), separators=(",", ":")).encode()).digest()
        keys = [int.from_bytes(digest[8 * i:8 * i + 8], "little") for i in range(FEISTEL_ROUNDS)]
        positions = list(range(0, n, 997))
        self.assertEqual(StableShuffle(n, *parts).at(np.array(positions)).tolist(),
                         [reference_feistel_value(n, p, keys) for p in positions])

    def test_parts_change_the_order(self):
        n = 100_003
        orders = {parts: StableShuffle(n, *parts).at(np.arange(64)).tolist()
                  for parts in [(1, "d", "b", 0), (1, "d", "b", 1), (2, "d", "b", 0),
                                (1, "e", "b", 0), (1, "d", "c", 0)]}
        self.assertEqual(len({tuple(o) for o in orders.values()}), len(orders))
        self.assertEqual(StableShuffle(n, 1, "d", "b", 0).at(np.arange(64)).tolist(),
                         orders[(1, "d", "b", 0)])

    def test_well_spread_like_a_random_permutation(self):
        n = 200_000
        values = StableShuffle(n, 3, "ds", "64x64", 0).at(np.arange(n)).astype(np.float64)
        positions = np.arange(n, dtype=np.float64)
        self.assertLess(abs(np.corrcoef(positions, values)[0, 1]), 0.01)
        self.assertLess(int(np.sum(values == positions)), 10)  # fixed points: about 1 expected
        neighbours = np.abs(np.diff(values)) == 1  # adjacent positions, adjacent values
        self.assertLess(int(neighbours.sum()), 20)  # about 2 expected
        # Each tenth of the positions draws evenly from every tenth of the values.
        counts = np.histogram2d(positions, values, bins=10)[0]
        expected = n / 100
        self.assertLess(float(((counts - expected) ** 2 / expected).sum()), 160)  # chi2, 81 dof

    def test_small_shuffles_are_the_sorted_stream(self):
        n = FEISTEL_FROM - 1
        np.testing.assert_array_equal(StableShuffle(n, 4, "x").at(np.arange(n)),
                                      stable_permutation(n, 4, "x"))


class GoldenValuesTest(unittest.TestCase):
    """Values frozen once from the code of SPLIT_VERSION 2. If one of these changes, every
    bucket is shuffled differently under the same seed: resumed runs would silently reorder and
    traces would stop matching, so SPLIT_VERSION (split.py) must change along with them."""

    FIRST_TEN = {
        # sorted PCG64 keys (n < FEISTEL_FROM)
        (1000, 7, "photos", "64x64", 0): [21, 18, 56, 921, 776, 205, 589, 419, 152, 138],
        (1000, 7, "photos", "64x64", 1): [196, 593, 425, 400, 570, 586, 621, 955, 977, 878],
        # keyed Feistel network (n >= FEISTEL_FROM)
        (70000, 7, "photos", "1024x768", 0): [28778, 58867, 14829, 35927, 45445, 44344, 61636,
                                              64709, 36599, 19169],
        (70000, 123456789, "art", "512x512", 2): [39909, 24768, 37155, 56981, 27508, 21631,
                                                  19327, 33970, 12052, 37383],
    }
    # split_bucket of ids img/00000.png.. (dataset 'photos', seed 7, epoch 1, batch 2 x 3
    # processes, bucket_tail trim): each rank's first 6 canonical occurrences, then the trimmed
    # ids. (Version 3 changed only evaluation splits: these stay.)
    RANK_SLICES = {
        (50, "64x64"): ([[0, 34, 16, 47, 35, 30], [18, 15, 45, 14, 31, 9],
                         [32, 22, 19, 33, 49, 6]], ["img/00005.png", "img/00038.png"]),
        (70001, "1024x768"): ([[10091, 27132, 7888, 24850, 1300, 23198],
                               [14600, 38922, 29681, 33092, 32805, 27209],
                               [45135, 13909, 4811, 69656, 32524, 67892]],
                              ["img/44605.png", "img/14951.png", "img/03779.png",
                               "img/60247.png", "img/06108.png"]),
    }

    def test_first_positions_of_small_and_large_permutations(self):
        for (n, *parts), expected in self.FIRST_TEN.items():
            with self.subTest(n=n, parts=parts):
                self.assertEqual(StableShuffle(n, *parts).at(np.arange(10)).tolist(), expected)

    def test_rank_slices_of_a_small_and_a_large_bucket(self):
        effective = EffectiveBatch.for_dataset(2, 3, 1)
        for (n, bucket), (firsts, trimmed) in self.RANK_SLICES.items():
            sample_ids = [f"img/{i:05d}.png" for i in range(n)]
            for rank, first in enumerate(firsts):
                with self.subTest(n=n, rank=rank):
                    piece = split_bucket(sample_ids, dataset_id="photos", bucket=bucket, epoch=1,
                                         seed=7, repeats=0, effective=effective, rank=rank,
                                         tail="trim")
                    self.assertEqual(piece.occurrences[:6].tolist(), first)
                    self.assertEqual(piece.micro_batch(0), [sample_ids[i] for i in first[:2]])
                    self.assertEqual(piece.trimmed, trimmed)

    def test_the_sampler_schedule_order(self):
        self.assertEqual(stable_permutation(12, "schedule", 7, 0).tolist(),
                         [0, 3, 1, 2, 9, 11, 7, 10, 8, 5, 4, 6])

    def test_the_values_belong_to_this_split_version(self):
        # New golden values come with a new SPLIT_VERSION; update both here together.
        self.assertEqual(SPLIT_VERSION, 3)


if __name__ == "__main__":
    unittest.main()
