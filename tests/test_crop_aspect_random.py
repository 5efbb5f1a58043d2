"""crop_aspect 'random': each sample's aspect is drawn by weight from a digest of (dataset id,
sample id), so its bucket is the same on every rank, run and resume, and its latent is cropped
to that bucket, not to the bucket nearest the image's own aspect."""

from __future__ import annotations

import json
import tempfile
import unittest
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from simpletuner.configuration import ConfigError, DatasetConfig, load_configuration
from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.caching.storage import load_entry
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.buckets import (
    BucketSettings, bucket_for, parse_bucket_key, sample_bucket,
)

from discovery_fixtures import dataset_config, encode, image, training_config, write

TRAINING = training_config(Path("out"), resolution=64, aspect_bucket_alignment=16)


def random_settings(buckets: list, dataset_id: str = "d") -> BucketSettings:
    dataset = DatasetConfig(id=dataset_id, instance_data_dir="/x", crop=True,
                            crop_aspect="random", crop_aspect_buckets=buckets)
    return BucketSettings.for_dataset(dataset, TRAINING)


class DrawnBucketTest(unittest.TestCase):
    def test_the_bucket_does_not_depend_on_the_images_own_size(self):
        settings = random_settings([0.5, 1.0, 2.0])
        for i in range(200):
            sample_id = f"img/{i:04d}.png"
            buckets = {sample_bucket("d", sample_id, w, h, settings)
                       for w, h in ((1000, 250), (64, 64), (250, 1000), (96, 64))}
            self.assertEqual(len(buckets), 1, sample_id)

    def test_buckets_are_filled_by_weight_and_a_zero_weight_never(self):
        weights = {0.5: 1, 1.0: 2, 2.0: 1, 1.5: 0}
        settings = random_settings([{"aspect_bucket": a, "weight": w} for a, w in weights.items()])
        counts = Counter(sample_bucket("d", f"img/{i:05d}.png", 64, 64, settings)
                         for i in range(20000))
        self.assertEqual(set(counts), {"64x128", "64x64", "128x64"})
        for key, share in (("64x128", 0.25), ("64x64", 0.5), ("128x64", 0.25)):
            self.assertAlmostEqual(counts[key] / 20000, share, delta=0.015)

    def test_plain_numbers_weigh_the_same(self):
        counts = Counter(sample_bucket("d", f"{i}.png", 64, 64, random_settings([0.5, 2.0]))
                         for i in range(10000))
        self.assertAlmostEqual(counts["64x128"] / 10000, 0.5, delta=0.02)

    def test_the_draw_depends_on_the_dataset_id(self):
        first, second = random_settings([0.5, 2.0], "a"), random_settings([0.5, 2.0], "b")
        ids = [f"{i}.png" for i in range(100)]
        self.assertNotEqual([sample_bucket("a", s, 64, 64, first) for s in ids],
                            [sample_bucket("b", s, 64, 64, second) for s in ids])

    def test_size_based_lookup_is_refused_for_drawn_buckets(self):
        with self.assertRaises(ValueError):
            bucket_for(64, 64, random_settings([1.0]))


class RandomIndexTest(unittest.TestCase):
    """One image size only: a per-size decision would put every sample in one bucket."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "data"
        for i in range(40):
            write(self.data, f"img{i:02d}.png", encode(image(64, 64, seed=i), "PNG"))

    def backend(self, output: str, **dataset) -> MetadataBackend:
        options = dict(crop=True, crop_aspect="random", crop_aspect_buckets=[0.75, 1.0, 1.5])
        options.update(dataset)
        return MetadataBackend.from_config(dataset_config(self.data, **options),
                                           training_config(self.root / output))

    def test_two_independent_builds_give_the_same_index_over_every_bucket(self):
        first, second = self.backend("out1"), self.backend("out2")
        index = first.refresh_index(show_progress=False)
        again = second.refresh_index(show_progress=False)
        self.assertEqual(set(index.buckets), {"64x80", "64x64", "96x64"})
        self.assertEqual(index.digest(), again.digest())
        self.assertEqual(first.cache_path.read_bytes(), second.cache_path.read_bytes())
        self.assertEqual(second.load_index(), index)
        for key, ids in index.buckets.items():
            for sample_id in ids:
                self.assertEqual(sample_bucket("photos", sample_id, 64, 64,
                                               first.bucket_settings), key)

    def test_the_cache_is_keyed_by_the_aspect_mode_and_its_weights(self):
        random = self.backend("out")
        random.refresh_index(show_progress=False)
        weighted = self.backend("out", crop_aspect_buckets=[
            0.75, 1.0, {"aspect_bucket": 1.5, "weight": 3}])
        closest = self.backend("out", crop_aspect="closest")
        self.assertEqual(len({json.dumps(b.settings()) for b in (random, weighted, closest)}), 3)
        self.assertEqual(set(closest.refresh_index(show_progress=False).buckets), {"64x64"})

    def test_each_latent_is_cropped_to_its_own_bucket(self):
        index = self.backend("out").refresh_index(show_progress=False)
        settings = LatentSettings("photos", MetadataBackend.from_config(
            dataset_config(self.data), training_config(self.root / "out")).storage,
            self.root / "vae", "pool-8", crop=True)
        result = cache_latents(index, settings, lambda pixels: F.avg_pool2d(pixels, 8),
                               progress=False)
        self.assertEqual((result.failures, result.encoded), ({}, 40))
        for key, ids in index.buckets.items():
            width, height = parse_bucket_key(key)
            for sample_id in ids:
                entry = load_entry(result.cache.paths[sample_id], sample_id)
                self.assertEqual(tuple(entry["latent"].shape), (3, height // 8, width // 8))
                self.assertEqual(entry["geometry"][4:].tolist(), [height, width])
                self.assertTrue(torch.isfinite(entry["latent"]).all())


class RandomAspectConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()

    def load(self, **dataset):
        backend = self.root / "multidatabackend.json"
        backend.write_text(json.dumps([{"id": "d", "instance_data_dir": "images", **dataset}]))
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": str(backend)}))
        return load_configuration(config, cwd=self.root)

    def problems(self, **dataset) -> str:
        with self.assertRaises(ConfigError) as caught:
            self.load(**dataset)
        return str(caught.exception)

    def test_simpletuners_weighted_entries_are_accepted(self):
        buckets = [0.75, {"aspect_bucket": 1.5, "weight": 0.25}]
        (dataset,) = self.load(crop=True, crop_aspect="random",
                               crop_aspect_buckets=buckets).datasets
        self.assertEqual(dataset.weighted_crop_aspects(), [(0.75, 1.0), (1.5, 0.25)])

    def test_mistakes_are_named(self):
        self.assertIn("'random' needs 'crop': true",
                      self.problems(crop_aspect="random", crop_aspect_buckets=[1.0]))
        self.assertIn("'random' needs 'crop_aspect_buckets'",
                      self.problems(crop=True, crop_aspect="random"))
        self.assertIn("a weighted entry is", self.problems(
            crop=True, crop_aspect="random", crop_aspect_buckets=[{"aspect": 1.0}]))
        self.assertIn("not all 0", self.problems(
            crop=True, crop_aspect="random",
            crop_aspect_buckets=[{"aspect_bucket": 1.0, "weight": 0}]))
        self.assertIn("weights are used with crop_aspect 'random' only", self.problems(
            crop=True, crop_aspect="closest",
            crop_aspect_buckets=[{"aspect_bucket": 1.0, "weight": 1}]))
        self.assertIn("positive aspect ratios", self.problems(
            crop=True, crop_aspect="random", crop_aspect_buckets=[0.0, 1.0]))


if __name__ == "__main__":
    unittest.main()
