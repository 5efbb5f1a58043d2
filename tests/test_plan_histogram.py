"""plan's bucket histogram marks the buckets too small for one effective batch."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from PIL import Image

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.split import DatasetSpec
from simpletuner.plan_report import (BAR_COLOUR, UNDERSIZED_COLOUR, undersized_buckets,
                                     write_histogram)


def ids(n: int, prefix: str) -> list[str]:
    return [f"{prefix}{i:03d}.png" for i in range(n)]


class UndersizedBucketsTest(unittest.TestCase):
    def test_buckets_below_e_counting_repeats(self):
        buckets = {"64x64": ids(8, "a"), "96x64": ids(3, "b"), "64x96": ids(2, "c")}
        spec = DatasetSpec("d", buckets, 1, 2, False, False)  # repeats 1, batch 2
        self.assertEqual(undersized_buckets(spec, processes=3, accumulation=1), {"64x96"})  # E 6
        self.assertEqual(undersized_buckets(spec, processes=4, accumulation=1),
                         {"96x64", "64x96"})

    def test_histogram_draws_undersized_buckets_red(self):
        index = DatasetIndex("d", {"64x64": ids(8, "a"), "64x96": ids(2, "c")}, {})
        with tempfile.TemporaryDirectory() as tmp:
            marked, plain = Path(tmp) / "marked.png", Path(tmp) / "plain.png"
            write_histogram([index], marked, {"d": {"64x96"}})
            write_histogram([index], plain)
            with Image.open(marked) as a, Image.open(plain) as b:
                colours_a = {c for _, c in a.convert("RGB").getcolors(1 << 16)}
                colours_b = {c for _, c in b.convert("RGB").getcolors(1 << 16)}
        self.assertIn(UNDERSIZED_COLOUR, colours_a)
        self.assertIn(BAR_COLOUR, colours_a)
        self.assertNotIn(UNDERSIZED_COLOUR, colours_b)


if __name__ == "__main__":
    unittest.main()
