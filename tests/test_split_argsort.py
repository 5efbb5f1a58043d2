"""The split's fast argsort must give exactly the stable argsort's order, ties included: the
permutation every rank slices depends on it (see benchmarks/bench_split.py for why it exists)."""

from __future__ import annotations

import unittest

import numpy as np

from simpletuner.helpers.metadata.split import stable_argsort, stable_permutation, stable_seed


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

    def test_permutation_is_the_stable_order_of_the_seeded_stream(self):
        n = 5000
        keys = np.random.PCG64(stable_seed(7, "ds", "64x64", 3)).random_raw(n)
        np.testing.assert_array_equal(stable_permutation(n, 7, "ds", "64x64", 3),
                                      np.argsort(keys, kind="stable"))


if __name__ == "__main__":
    unittest.main()
