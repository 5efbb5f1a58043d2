import itertools
import math
import unittest

import numpy as np

from simpletuner.helpers.metadata.backends.bucketing import distinct_sizes
from simpletuner.helpers.metadata.buckets import (
    BucketSettings, SizeFilters, bucket_for, bucket_key, parse_bucket_key, target_size,
)

EDGES = [1, 7, 63, 64, 65, 200, 333, 512, 640, 777, 1000, 1024, 1536, 2048, 3000, 4000, 8191]
ALIGNMENTS = [8, 16, 32, 64]


def size_grid():
    return itertools.product(EDGES, EDGES)


class PixelBucketTest(unittest.TestCase):
    def test_short_edge_is_resolution_and_aspect_within_rounding(self):
        for alignment, resolution in itertools.product(ALIGNMENTS, [256, 512, 1024]):
            settings = BucketSettings(resolution, "pixel", alignment, square=False)
            for width, height in size_grid():
                with self.subTest(alignment=alignment, resolution=resolution, size=(width, height)):
                    w, h = target_size(width, height, settings)
                    self.assertEqual(w % alignment, 0)
                    self.assertEqual(h % alignment, 0)
                    self.assertEqual(min(w, h), resolution)
                    # orientation kept
                    if w != h:  # orientation kept; nearly square images may go square
                        self.assertEqual(w > h, width > height)
                    exact = max(width, height) / min(width, height)
                    got = max(w, h) / min(w, h)
                    self.assertLessEqual(abs(got - exact) / exact, alignment / (2 * min(w, h)) + 1e-12)

    def test_resolution_not_a_multiple_is_rounded_to_alignment(self):
        settings = BucketSettings(1000, "pixel", 64, square=False)
        self.assertEqual(target_size(3000, 2000, settings), (1536, 1024))
        settings = BucketSettings(1000, "pixel", 8, square=False)
        self.assertEqual(target_size(1000, 1000, settings), (1000, 1000))

    def test_known_values(self):
        settings = BucketSettings(512, "pixel", 64, square=False)
        self.assertEqual(bucket_for(1024, 768, settings), "704x512")   # 682.7 -> 704
        self.assertEqual(bucket_for(768, 1024, settings), "512x704")
        self.assertEqual(bucket_for(50, 50, settings), "512x512")      # upscaled


class AreaBucketTest(unittest.TestCase):
    def test_area_close_to_target_and_aspect_within_rounding(self):
        for alignment, megapixels in itertools.product(ALIGNMENTS, [0.25, 0.5, 1.0]):
            settings = BucketSettings(megapixels, "area", alignment, square=False)
            target = megapixels * 1_000_000
            for width, height in size_grid():
                with self.subTest(alignment=alignment, megapixels=megapixels, size=(width, height)):
                    w, h = target_size(width, height, settings)
                    self.assertEqual(w % alignment, 0)
                    self.assertEqual(h % alignment, 0)
                    if w != h:  # orientation kept; nearly square images may go square
                        self.assertEqual(w > h, width > height)
                    exact = max(width, height) / min(width, height)
                    got = max(w, h) / min(w, h)
                    self.assertLessEqual(abs(got - exact) / exact, alignment / (2 * min(w, h)) + 1e-12)
                    ideal_short = math.sqrt(target / exact)
                    if ideal_short >= alignment:
                        # The aligned short edge nearest the ideal one is at most alignment/2
                        # away; the chosen size is at least as close in area as that one.
                        half = alignment / 2
                        bound = (ideal_short + half) * half + exact * half * (2 * ideal_short + half)
                        self.assertLessEqual(abs(w * h - target), bound)

    def test_no_other_aligned_size_of_this_aspect_is_closer(self):
        # Brute force over short edges: among sizes whose long edge is the rounded aspect,
        # the chosen one has the area closest to the target.
        for alignment in ALIGNMENTS:
            settings = BucketSettings(1.0, "area", alignment, square=False)
            for width, height in [(3000, 2000), (1000, 1000), (4000, 1000), (1234, 987), (640, 480)]:
                ratio = max(width, height) / min(width, height)
                best = min(
                    abs(s * max(alignment, math.floor(s * ratio / alignment + 0.5) * alignment) - 1e6)
                    for s in range(alignment, 4096, alignment)
                )
                w, h = target_size(width, height, settings)
                self.assertAlmostEqual(abs(w * h - 1e6), best, msg=(alignment, width, height))

    def test_square_megapixel(self):
        self.assertEqual(bucket_for(1000, 1000, BucketSettings(1.0, "area", 64, False)), "1024x1024")


class SquareCropTest(unittest.TestCase):
    def test_every_aspect_lands_in_one_square_bucket(self):
        for resolution_type, resolution in [("pixel", 512), ("area", 0.25)]:
            settings = BucketSettings(resolution, resolution_type, 64, square=True)
            keys = {bucket_for(w, h, settings) for w, h in size_grid()}
            self.assertEqual(len(keys), 1)
            w, h = parse_bucket_key(keys.pop())
            self.assertEqual(w, h)


class BucketKeyTest(unittest.TestCase):
    def test_round_trip(self):
        for size in [(64, 64), (1536, 1024), (8, 4096)]:
            self.assertEqual(parse_bucket_key(bucket_key(size)), size)

    def test_rejects_malformed(self):
        for bad in ["", "512", "512x", "x512", "1.5x2", "512X512", "a x b"]:
            with self.assertRaises(ValueError, msg=bad):
                parse_bucket_key(bad)

    def test_rejects_empty_image(self):
        with self.assertRaises(ValueError):
            target_size(0, 10, BucketSettings(512, "pixel", 64, False))


class FilterTest(unittest.TestCase):
    def test_pixel_minimum_uses_short_edge(self):
        filters = SizeFilters("pixel", minimum_image_size=512)
        self.assertIsNone(filters.reason_to_skip(512, 4000))
        self.assertIn("too small", filters.reason_to_skip(4000, 511))

    def test_area_minimum_uses_megapixels(self):
        filters = SizeFilters("area", minimum_image_size=0.5)
        self.assertIsNone(filters.reason_to_skip(1000, 500))   # exactly 0.5 MP
        self.assertIn("too small", filters.reason_to_skip(999, 500))
        self.assertIsNone(filters.reason_to_skip(5000, 101))   # short edge tiny, area fine

    def test_maximum(self):
        self.assertIn("too large", SizeFilters("pixel", maximum_image_size=1000).reason_to_skip(1001, 1001))
        self.assertIsNone(SizeFilters("pixel", maximum_image_size=1000).reason_to_skip(1000, 9000))
        self.assertIn("too large", SizeFilters("area", maximum_image_size=1).reason_to_skip(1001, 1000))

    def test_aspect_limits_are_inclusive(self):
        filters = SizeFilters("pixel", minimum_aspect_ratio=0.5, maximum_aspect_ratio=2.0)
        self.assertIsNone(filters.reason_to_skip(200, 400))
        self.assertIsNone(filters.reason_to_skip(400, 200))
        self.assertIn("aspect", filters.reason_to_skip(199, 400))
        self.assertIn("aspect", filters.reason_to_skip(401, 200))

    def test_no_filters_keep_everything(self):
        filters = SizeFilters("pixel")
        for width, height in size_grid():
            self.assertIsNone(filters.reason_to_skip(width, height))



class DistinctSizesTest(unittest.TestCase):
    """A file table's sizes told apart by counting where that is possible, else by sorting:
    the same answer as numpy's unique of the packed sizes either way."""

    def test_counted_or_sorted_the_sizes_and_each_rows_place_are_uniques(self):
        rng = np.random.default_rng(0)
        cases = {
            "camera sizes": (rng.choice([512, 640, 768, 4032], 20_000),
                             rng.choice([512, 768, 3024], 20_000)),
            "one size": (np.full(5, 64), np.full(5, 96)),
            "a side past the counted range": (np.array([70_000, 64, 64]), np.array([1, 2, 1])),
            "too many combinations to count": (rng.integers(1, 3000, 50_000),
                                               rng.integers(1, 3000, 50_000)),
            "largest counted side": (np.array([65_535, 1]), np.array([1, 65_535])),
            "none": (np.zeros(0, np.int64), np.zeros(0, np.int64)),
        }
        for name, (widths, heights) in cases.items():
            with self.subTest(name):
                widths, heights = widths.astype(np.int64), heights.astype(np.int64)
                sizes, place = distinct_sizes(widths, heights)
                expected, expected_place = np.unique(widths << 32 | heights, return_inverse=True)
                self.assertEqual(sizes.tolist(), expected.tolist())
                self.assertEqual(place.ravel().tolist(), expected_place.ravel().tolist())
                self.assertEqual((sizes[place] >> 32).tolist(), widths.tolist())


if __name__ == "__main__":
    unittest.main()
