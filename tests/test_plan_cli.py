"""`python -m simpletuner plan` end to end, in a subprocess, over a mixed folder with broken files."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from PIL import Image

from discovery_fixtures import encode, image, rotated_jpeg, write
from launching import run_bounded

ALIGNMENT = 16
SHAPES = [(64, 64), (96, 64), (64, 96), (128, 64), (64, 128), (80, 60), (60, 80), (150, 100), (70, 130)]
FORMATS = [("JPEG", ".jpg"), ("PNG", ".png"), ("WEBP", ".webp"), ("BMP", ".bmp"), ("TIFF", ".tif")]


def run_plan(config: Path, *args: str) -> subprocess.CompletedProcess:
    return run_bounded([sys.executable, "-m", "simpletuner", "plan", "--config", config, *args],
                       tmpdir=config.parent, cwd=config.parent, timeout=120)


class PlanCommandTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "images"
        self.good: dict[str, tuple[int, int]] = {}   # sample id -> oriented size
        self.broken: dict[str, str] = {}             # sample id -> expected reason fragment
        rng = random.Random(5)
        for i in range(48):
            width, height = rng.choice(SHAPES)
            fmt, ext = FORMATS[i % len(FORMATS)]
            name = f"set{i % 4}/img_{i:03d}{ext}"
            write(self.data, name, encode(image(width, height, seed=i), fmt))
            self.good[name] = (width, height)
        for i in range(4):  # stored landscape, displayed portrait
            name = f"rotated/r{i}.jpg"
            write(self.data, name, rotated_jpeg(96, 64, 6))
            self.good[name] = (64, 96)
        jpeg = encode(image(96, 64), "JPEG")
        broken = {
            "bad/empty.png": (b"", "zero-byte"),
            "bad/notes.jpg": (b"shopping list\n" * 20, "not an image"),
            "bad/cut_header.jpg": (jpeg[:10], "header"),
            "bad/cut_data.jpg": (jpeg[: len(jpeg) // 2], "truncated"),
            "bad/tiny.png": (encode(image(20, 20), "PNG"), "too small"),
            "bad/strip.png": (encode(image(200, 32), "PNG"), "aspect ratio"),
        }
        for name, (data, reason) in broken.items():
            write(self.data, name, data)
            self.broken[name] = reason
        write(self.data, "bad/nocaption.jpg", jpeg, caption=None)
        self.broken["bad/nocaption.jpg"] = "missing caption"
        write(self.data, ".thumbs/hidden.jpg", jpeg)  # hidden: not a sample at all
        self.output = self.root / "out"
        self.config = self.root / "config.json"
        self.config.write_text(json.dumps({
            "--model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": "multidatabackend.json",
            "resolution": 64, "aspect_bucket_alignment": ALIGNMENT,
        }))
        (self.root / "multidatabackend.json").write_text(json.dumps([{
            "id": "mixed", "instance_data_dir": "images", "minimum_image_size": 32,
            "minimum_aspect_ratio": 0.4, "maximum_aspect_ratio": 2.5,
        }]))

    def test_json_indexes_exactly_the_good_images_and_a_second_run_reads_none(self):
        first = run_plan(self.config, "--json")
        self.assertEqual(first.returncode, 0, first.stderr)
        plan = json.loads(first.stdout)  # stdout is only JSON
        self.assertEqual(list(plan["datasets"]), ["mixed"])
        result = plan["datasets"]["mixed"]
        indexed = [sample for ids in result["buckets"].values() for sample in ids]
        self.assertEqual(sorted(indexed), sorted(self.good))  # each good image exactly once
        for key, ids in result["buckets"].items():
            bucket_w, bucket_h = (int(v) for v in key.split("x"))
            self.assertEqual((bucket_w % ALIGNMENT, bucket_h % ALIGNMENT), (0, 0))
            for sample in ids:
                width, height = self.good[sample]
                aspect, bucket_aspect = width / height, bucket_w / bucket_h
                self.assertLessEqual(abs(bucket_aspect - aspect) / aspect,
                                     ALIGNMENT / (2 * min(bucket_w, bucket_h)), (sample, key))
        reasons = {s["path"]: s["reason"] for s in result["skipped"]}
        self.assertEqual(len(result["skipped"]), len(self.broken))
        self.assertEqual(set(reasons), set(self.broken))
        for name, fragment in self.broken.items():
            self.assertIn(fragment, reasons[name])
        self.assertIn(f"{len(self.good) + len(self.broken)} headers read", first.stderr)
        self.assertNotIn("reused from cache", first.stderr)  # a first run has no cache
        histogram = self.output / "bucket_histogram.png"
        with Image.open(histogram) as png:
            self.assertEqual(png.format, "PNG")

        cache = self.output / "cache" / "metadata" / "mixed.index"
        cache_mtime = cache.stat().st_mtime_ns
        second = run_plan(self.config, "--json")
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertIn(f"0 headers read, {len(self.good) + len(self.broken)} reused from cache",
                      second.stderr)
        self.assertEqual(json.loads(second.stdout), plan)
        self.assertEqual(cache.stat().st_mtime_ns, cache_mtime)

    def test_table_output(self):
        result = run_plan(self.config)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("dataset 'mixed'", result.stdout)
        self.assertIn("share", result.stdout)
        self.assertIn(f"total {len(self.good)}".replace(" ", ""), result.stdout.replace(" ", ""))
        self.assertIn(f"skipped: {len(self.broken)}", result.stdout)

    def test_bad_config_exits_2_with_every_problem(self):
        self.config.write_text(json.dumps({"model_family": "sd9", "output_dir": "out",
                                           "data_backend_config": "multidatabackend.json",
                                           "pretrained_model_name_or_path": "x",
                                           "train_batch_sise": 1}))
        result = run_plan(self.config, "--json")
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        self.assertIn("2 configuration problems", result.stderr)
        self.assertIn("did you mean 'train_batch_size'", result.stderr)
        self.assertFalse(self.output.exists())


if __name__ == "__main__":
    unittest.main()
