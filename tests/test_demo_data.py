"""The generated demo dataset: deterministic bytes, three aspect ratios, captions that match."""

from __future__ import annotations

import hashlib
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np
from PIL import Image

from launching import run_bounded
from simpletuner.demo_data import COLOURS, MARKER, ensure_demo_dataset


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


class DemoDatasetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.folder = ensure_demo_dataset(cls.tmp / "first")
        cls.images = sorted(cls.folder.glob("*.png"))

    def test_two_generations_are_byte_identical(self):
        # A separate interpreter, so nothing cached in this process can make them agree.
        second = self.tmp / "second"
        made = run_bounded([sys.executable, "-m", "simpletuner.demo_data", second],
                           tmpdir=self.tmp, timeout=120)
        self.assertEqual(made.returncode, 0, made.stderr[-3000:])
        self.assertEqual(file_hashes(self.folder), file_hashes(second))

    def test_about_a_hundred_images_in_three_aspect_ratios(self):
        self.assertTrue(90 <= len(self.images) <= 150, len(self.images))
        sizes = {}
        for path in self.images:
            with Image.open(path) as image:
                sizes[image.size] = sizes.get(image.size, 0) + 1
        ratios = {round(w / h, 3) for w, h in sizes}
        self.assertGreaterEqual(len(ratios), 3, sizes)
        self.assertTrue(all(count >= 20 for count in sizes.values()), sizes)

    def test_every_image_has_a_caption_that_matches_its_pixels(self):
        for path in self.images:
            caption_file = path.with_suffix(".txt")
            self.assertTrue(caption_file.is_file(), caption_file)
            words = caption_file.read_text().split()
            # "a <colour> <shape> on a <colour> background" ("an" before a vowel)
            colour, background = words[1], words[5]
            article = "an" if colour[0] in "aeiou" else "a"
            self.assertEqual((words[0], words[3], words[4], words[-1]),
                             (article, "on", "a", "background"), words)
            pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)

            def share(name):
                distance = np.abs(pixels - np.array(COLOURS[name])).sum(axis=2)
                return float((distance < 30).mean())

            with self.subTest(path.name):
                self.assertGreater(share(colour), 0.05)       # the shape is clearly there
                self.assertGreater(share(background), 0.35)   # on that background
                self.assertLess(share(colour), share(background))

    def test_shapes_differ(self):
        captions = {p.with_suffix(".txt").read_text().split()[2] for p in self.images}
        self.assertGreaterEqual(len(captions), 3)

    def test_complete_folder_is_left_alone(self):
        before = {p.name: p.stat().st_mtime_ns for p in self.folder.iterdir()}
        ensure_demo_dataset(self.folder)
        self.assertEqual({p.name: p.stat().st_mtime_ns for p in self.folder.iterdir()}, before)

    def test_incomplete_folder_is_completed(self):
        folder = ensure_demo_dataset(self.tmp / "partial")
        expected = file_hashes(folder)
        (folder / MARKER).unlink()          # as if interrupted before the marker
        victim = self.images[5].name
        (folder / victim).unlink()
        ensure_demo_dataset(folder)
        self.assertEqual(file_hashes(folder), expected)
        (folder / self.images[7].with_suffix(".txt").name).unlink()  # marker there, file gone
        ensure_demo_dataset(folder)
        self.assertEqual(file_hashes(folder), expected)
        self.assertEqual([p for p in folder.iterdir() if p.name.endswith(".tmp")], [])


if __name__ == "__main__":
    unittest.main()
