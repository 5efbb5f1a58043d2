"""Latent and text-embedding caches: warm start, keys, failures, partition, atomic writes.

The model is a stand-in (a fixed average-pool "VAE", a byte-derived "text encoder") that counts
its calls: the caches are under test, not the model."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from launching import run_bounded
from simpletuner.helpers.caching.failures import merge_failures
from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.caching.storage import model_identity, rank_share
from simpletuner.helpers.caching.text_embeds import TextEmbedCache, cache_text_embeds
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.image import Downsample, prepare_image


class CountingVae:
    def __init__(self):
        self.calls = 0
        self.images = 0

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.images += pixels.shape[0]
        return F.avg_pool2d(pixels, 8)


class CountingTextEncoder:
    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        self.seen.extend(prompts)
        rows = [torch.tensor(list(p.encode()[:6].ljust(6, b"\0")), dtype=torch.float32)
                for p in prompts]
        embeds = torch.stack(rows)
        return {"prompt_embeds": embeds[:, None, :].expand(-1, 3, -1) / 255,
                "pooled": embeds.sum(dim=1, keepdim=True)}


def write_dataset(root: Path, sizes: dict[str, tuple[int, int]]) -> None:
    for i, (name, (w, h)) in enumerate(sorted(sizes.items())):
        values = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(values).save(root / name)


def make_index(sizes: dict[str, tuple[int, int]], buckets: dict[str, list[str]]) -> DatasetIndex:
    return DatasetIndex("shapes", {k: sorted(v) for k, v in buckets.items()}, dict(sizes))


SIZES = {f"img{i:02d}.png": (96, 64) if i % 3 == 0 else (64, 64) if i % 3 == 1 else (64, 96)
         for i in range(12)}
BUCKETS = {"96x64": [s for s, wh in SIZES.items() if wh == (96, 64)],
           "64x64": [s for s, wh in SIZES.items() if wh == (64, 64)],
           "64x96": [s for s, wh in SIZES.items() if wh == (64, 96)]}


class LatentCacheTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.root = self.tmp / "data"
        write_dataset(self.root, SIZES)
        self.index = make_index(SIZES, BUCKETS)
        self.settings = LatentSettings("shapes", LocalStorage(self.root),
                                       self.tmp / "vae", "model-a")

    def run_cache(self, settings=None, index=None, **kwargs):
        vae = CountingVae()
        result = cache_latents(index or self.index, settings or self.settings, vae,
                               progress=False, **kwargs)
        return result, vae

    def test_entries_hold_the_sample_latent_and_geometry(self):
        result, vae = self.run_cache(batch_size=3)
        self.assertEqual(vae.images, 12)
        self.assertEqual(result.encoded, 12)
        self.assertEqual(result.failures, {})
        for bucket, ids in BUCKETS.items():
            w, h = map(int, bucket.split("x"))
            for sample_id in ids:
                expected = prepare_image(self.root / sample_id, (w, h), crop=False)
                entry = load_file(result.cache.paths[sample_id])
                self.assertTrue(torch.allclose(entry["latent"],
                                               F.avg_pool2d(expected.pixels[None], 8)[0]))
                self.assertEqual(entry["geometry"].tolist(),
                                 [*expected.original_size, *expected.crop_top_left, h, w])

    def test_warm_start_encodes_nothing(self):
        first, _ = self.run_cache()
        second, vae = self.run_cache()
        self.assertEqual((vae.calls, second.encoded), (0, 0))
        self.assertEqual(first.cache.paths, second.cache.paths)

    def test_batches_never_mix_buckets(self):
        _, vae = self.run_cache(batch_size=100)
        self.assertEqual(vae.calls, 3)  # one batch per bucket, though all would fit in one

    def test_changed_settings_reencode(self):
        self.run_cache()
        changes = {
            "model": LatentSettings("shapes", LocalStorage(self.root), self.tmp / "vae", "model-b"),
            "crop": LatentSettings("shapes", LocalStorage(self.root),
                                   self.tmp / "vae", "model-a", crop=True),
            "downsample": LatentSettings("shapes", LocalStorage(self.root), self.tmp / "vae",
                                         "model-a", crop=True,
                                         downsample=Downsample("pixel", 32, 48)),
            "target": None,
        }
        for what, settings in changes.items():
            with self.subTest(what):
                index = self.index
                if what == "target":
                    index = make_index(SIZES, {"32x32": sorted(SIZES)})
                _, vae = self.run_cache(settings=settings, index=index)
                self.assertEqual(vae.images, 12)

    def test_seed_matters_only_for_random_crops(self):
        def settings(style, seed):
            return LatentSettings("shapes", LocalStorage(self.root),
                                  self.tmp / "vae", "m", True, style, seed)
        self.run_cache(settings("center", 1))
        self.assertEqual(self.run_cache(settings("center", 2))[1].images, 0)
        self.run_cache(settings("random", 1))
        self.assertEqual(self.run_cache(settings("random", 1))[1].images, 0)
        self.assertEqual(self.run_cache(settings("random", 2))[1].images, 12)

    def test_modified_file_is_reencoded_alone(self):
        self.run_cache()
        target = self.root / "img04.png"
        stat = target.stat()
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
        _, vae = self.run_cache()
        self.assertEqual(vae.images, 1)

    def test_broken_and_missing_images_are_reported_and_removed(self):
        broken = (self.root / "img05.png").read_bytes()
        (self.root / "img05.png").write_bytes(broken[: len(broken) // 3])
        (self.root / "img07.png").unlink()
        result, vae = self.run_cache()
        self.assertEqual(sorted(result.failures), ["img05.png", "img07.png"])
        self.assertIn("decode", result.failures["img05.png"])
        self.assertEqual(vae.images, 10)
        kept = self.index.without(result.failures)
        self.assertEqual(kept.sample_count, 10)
        self.assertEqual(sorted(s.path for s in kept.skipped), ["img05.png", "img07.png"])
        self.assertEqual(result.cache.missing([s for ids in kept.buckets.values() for s in ids]),
                         [])

    def test_a_file_that_cannot_be_read_stops_caching_instead_of_being_skipped(self):
        # A failed read says nothing about the image: a folder where the file was (stat
        # works, reading fails) must not be reported as an undecodable image and dropped.
        (self.root / "img04.png").unlink()
        (self.root / "img04.png").mkdir()
        with self.assertRaises(IsADirectoryError):
            self.run_cache()

    def test_ranks_share_the_work_exactly_once_and_agree_on_failures(self):
        broken = (self.root / "img02.png").read_bytes()
        (self.root / "img02.png").write_bytes(broken[:40])
        for world in range(1, 5):
            with self.subTest(world=world):
                settings = LatentSettings("shapes", LocalStorage(self.root),
                                          self.tmp / f"vae{world}", "m")
                results = [self.run_cache(settings=settings, rank=r, world_size=world)[0]
                           for r in range(world)]
                self.assertEqual(sum(r.encoded for r in results), 11)
                merged = merge_failures(r.failures for r in results)
                self.assertEqual(list(merged), ["img02.png"])
                self.assertEqual(merge_failures(r.failures for r in reversed(results)), merged)
                self.assertEqual(results[0].cache.missing(sorted(set(SIZES) - {"img02.png"})),
                                 [])

    def test_no_temporary_files_left(self):
        self.run_cache(rank=0, world_size=2)
        self.run_cache(rank=1, world_size=2)
        files = [p for p in (self.tmp / "vae").rglob("*") if p.is_file()]
        self.assertEqual(len(files), 12)
        self.assertTrue(all(p.suffix == ".safetensors" and not p.name.startswith(".")
                            for p in files))


class PartitionTest(unittest.TestCase):
    def test_every_item_exactly_once_for_any_world_size(self):
        for count in (0, 1, 3, 7, 64, 101):
            items = [f"s{i}" for i in reversed(range(count))]  # unsorted on purpose
            for world in range(1, 5):
                shares = [rank_share(items, r, world) for r in range(world)]
                flat = [s for share in shares for s in share]
                self.assertEqual(sorted(flat), sorted(items), (count, world))
                self.assertLessEqual(max(map(len, shares)) - min(map(len, shares)), 1)

    def test_rank_outside_world_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "outside"):
            rank_share(["a"], 2, 2)


class FailureMergeTest(unittest.TestCase):
    def test_merge_is_sorted_and_independent_of_rank_order(self):
        per_rank = [{"b.png": "bad"}, {}, {"c.png": "truncated", "a.png": "worse"}]
        merged = merge_failures(per_rank)
        self.assertEqual(list(merged), ["a.png", "b.png", "c.png"])
        self.assertEqual(merge_failures(reversed(per_rank)), merged)


class InterruptedCacheTest(unittest.TestCase):
    def test_model_error_propagates_and_rerun_finishes_the_rest(self):
        tmp = Path(tempfile.mkdtemp())
        write_dataset(tmp / "data", SIZES)
        settings = LatentSettings("shapes", LocalStorage(tmp / "data"), tmp / "vae", "m")
        index = make_index(SIZES, BUCKETS)

        class FailingSecondCall(CountingVae):
            def __call__(self, pixels):
                if self.calls == 1:
                    raise RuntimeError("out of memory")
                return super().__call__(pixels)

        with self.assertRaisesRegex(RuntimeError, "out of memory"):  # not an image failure
            cache_latents(index, settings, FailingSecondCall(), batch_size=2, progress=False)
        written = [p for p in (tmp / "vae").rglob("*") if p.is_file()]
        self.assertEqual(len(written), 2)
        self.assertTrue(all(not p.name.startswith(".") for p in written))
        vae = CountingVae()
        result = cache_latents(index, settings, vae, batch_size=2, progress=False)
        self.assertEqual((vae.images, result.encoded), (10, 10))


class ModelIdentityTest(unittest.TestCase):
    def test_changes_with_config_and_weights_but_not_other_components(self):
        root = Path(tempfile.mkdtemp())
        (root / "vae").mkdir()
        (root / "unet").mkdir()
        (root / "vae" / "config.json").write_text('{"scaling_factor": 0.18215}')
        (root / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"0" * 10)
        (root / "unet" / "config.json").write_text("{}")
        base = model_identity(root, ["vae"], "sd1x")
        self.assertEqual(model_identity(root, ["vae"], "sd1x"), base)
        self.assertNotEqual(model_identity(root, ["vae"], "sdxl"), base)
        (root / "unet" / "config.json").write_text('{"changed": true}')
        self.assertEqual(model_identity(root, ["vae"], "sd1x"), base)
        (root / "vae" / "config.json").write_text('{"scaling_factor": 0.13025}')
        changed_config = model_identity(root, ["vae"], "sd1x")
        self.assertNotEqual(changed_config, base)
        (root / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"0" * 11)
        self.assertNotEqual(model_identity(root, ["vae"], "sd1x"), changed_config)


class TextEmbedCacheTest(unittest.TestCase):
    def setUp(self):
        self.folder = Path(tempfile.mkdtemp())

    def test_unique_captions_encoded_once_and_loaded_in_order(self):
        captions = ["a red circle", "a blue square", "a red circle", "a green triangle"]
        encoder = CountingTextEncoder()
        cache = TextEmbedCache(self.folder, "te-a")
        self.assertEqual(cache_text_embeds(captions, cache, encoder, batch_size=2,
                                           progress=False), 3)
        self.assertEqual(sorted(encoder.seen), sorted(set(captions)))
        loaded = cache.load(["a green triangle", "a red circle", "a green triangle"])
        direct = CountingTextEncoder()(["a green triangle", "a red circle", "a green triangle"])
        self.assertEqual(set(loaded), {"prompt_embeds", "pooled"})
        for name in direct:
            self.assertEqual(loaded[name].shape, direct[name].shape)
            self.assertTrue(torch.equal(loaded[name], direct[name]))

    def test_warm_start_identity_change_and_ranks(self):
        captions = [f"caption {i}" for i in range(10)]
        for world in range(1, 5):
            folder = self.folder / f"w{world}"
            encoders = [CountingTextEncoder() for _ in range(world)]
            for rank in range(world):
                cache_text_embeds(captions, TextEmbedCache(folder, "te"), encoders[rank],
                                  rank=rank, world_size=world, progress=False)
            seen = [c for e in encoders for c in e.seen]
            self.assertEqual(sorted(seen), sorted(captions), world)
            again = CountingTextEncoder()
            self.assertEqual(cache_text_embeds(captions, TextEmbedCache(folder, "te"), again,
                                               progress=False), 0)
            self.assertEqual(again.seen, [])
        other = CountingTextEncoder()
        cache_text_embeds(captions, TextEmbedCache(self.folder / "w1", "te-b"), other,
                          progress=False)
        self.assertEqual(len(other.seen), 10)

    def test_missing_entry_names_the_caption(self):
        with self.assertRaisesRegex(FileNotFoundError, "never cached"):
            TextEmbedCache(self.folder, "te").load(["never cached"])


WORKER = r"""
import json, sys
from pathlib import Path
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.caching.prepare import prepare_caches
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch

root, out = Path(sys.argv[1]), Path(sys.argv[2])
accelerator = Accelerator(cpu=True)
index = DatasetIndex(**json.loads((root / "index.json").read_text()))
dataset = DatasetConfig(id="shapes", instance_data_dir=str(root / "data"))
caption = lambda sample_id: f"caption {int(sample_id[3:5]) % 4}"
encode_prompts = lambda prompts: {"prompt_embeds": torch.tensor(
    [[float(p[-1])] * 3 for p in prompts])}
prepared = prepare_caches(
    [dataset], {"shapes": index}, {"shapes": caption}, lambda px: F.avg_pool2d(px, 8),
    encode_prompts, model_folder=root / "model", family="sd1x", output_dir=root / "output",
    seed=0, rank=accelerator.process_index, world_size=accelerator.num_processes,
    progress=False)
kept = prepared.indexes["shapes"]
means, texts = {}, {}
for bucket, ids in kept.buckets.items():
    size = tuple(int(v) for v in bucket.split("x"))
    batch = prepared.assembler(MicroBatch(0, 0, "shapes", bucket, tuple(
        BatchSample("shapes", s, bucket, size, caption(s)) for s in ids)))
    means.update({s: round(float(m), 6) for s, m in zip(ids, batch.latents.mean((1, 2, 3)))})
    texts.update({s: float(t[0]) for s, t in zip(ids, batch.prompt_embeds["prompt_embeds"])})
(out / f"rank-{accelerator.process_index}.json").write_text(json.dumps({
    "merged": prepared.failures["shapes"], "digest": kept.digest(),
    "world": accelerator.num_processes, "means": means, "texts": texts}))
accelerator.end_training()
"""


class MultiProcessPrepareCachesTest(unittest.TestCase):
    def test_two_ranks_share_the_work_and_remove_the_same_broken_image(self):
        tmp = Path(tempfile.mkdtemp())
        write_dataset(tmp / "data", SIZES)
        broken = tmp / "data" / "img01.png"  # sorted position 1: rank 1's share of two
        broken.write_bytes(broken.read_bytes()[:50])
        for component in ("vae", "text_encoder", "tokenizer"):
            (tmp / "model" / component).mkdir(parents=True)
            (tmp / "model" / component / "config.json").write_text("{}")
        index = make_index(SIZES, BUCKETS)
        (tmp / "index.json").write_text(json.dumps(
            {"dataset_id": index.dataset_id,
             "buckets": {key: list(ids) for key, ids in index.buckets.items()},
             "original_sizes": index.original_sizes}))
        (tmp / "worker.py").write_text(WORKER)
        (tmp / "out").mkdir()
        env = dict(os.environ, ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
        done = run_bounded(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             "2", tmp / "worker.py", tmp, tmp / "out"], tmpdir=tmp, env=env, timeout=180)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        ranks = [json.loads((tmp / "out" / f"rank-{r}.json").read_text()) for r in range(2)]
        self.assertEqual([r["world"] for r in ranks], [2, 2])
        self.assertEqual([list(r["merged"]) for r in ranks], [["img01.png"]] * 2)
        self.assertEqual(ranks[0]["digest"], ranks[1]["digest"])
        # Every kept sample is readable on both ranks, with the same values, whoever wrote it.
        self.assertEqual(sorted(ranks[0]["means"]), sorted(set(SIZES) - {"img01.png"}))
        self.assertEqual(ranks[0]["means"], ranks[1]["means"])
        self.assertEqual(ranks[0]["texts"], ranks[1]["texts"])
        self.assertEqual(ranks[0]["texts"]["img06.png"], 2.0)  # "caption 2"
        latent_files = list((tmp / "output" / "cache" / "vae" / "shapes").rglob("*.safetensors"))
        text_files = list((tmp / "output" / "cache" / "text").rglob("*.safetensors"))
        self.assertEqual((len(latent_files), len(text_files)), (11, 4))


if __name__ == "__main__":
    unittest.main()
