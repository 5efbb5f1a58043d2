"""BatchAssembler: a MicroBatch of references -> the TrainingBatch the model sees."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.caching.text_embeds import TextEmbedCache, cache_text_embeds
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
from simpletuner.helpers.multiaspect.dataset import BatchAssembler


def fake_text_encoder(prompts: list[str]) -> dict[str, torch.Tensor]:
    # Row i is a function of prompt i only, so a mix-up between samples shows.
    codes = torch.tensor([[float(len(p)), float(sum(p.encode()) % 97)] for p in prompts])
    return {"prompt_embeds": codes[:, None, :].repeat(1, 5, 1), "pooled_prompt_embeds": codes}


class BatchAssemblyTest(unittest.TestCase):
    def setUp(self):
        tmp = Path(tempfile.mkdtemp())
        root = tmp / "data"
        root.mkdir()
        # Each image is one flat grey level, so its latent (an average pool) says which it is.
        self.levels = {f"{i}.png": 20 * i for i in range(6)}
        for name, level in self.levels.items():
            Image.fromarray(np.full((40, 80, 3), level, np.uint8)).save(root / name)
        self.captions = {name: f"caption of {name}" for name in self.levels}
        index = DatasetIndex("d", {"48x32": sorted(self.levels)},
                             {n: (80, 40) for n in self.levels})
        settings = LatentSettings("d", LocalStorage(root),
                                  tmp / "vae", "m", crop=True, crop_style="center")
        latents = cache_latents(index, settings, lambda px: F.avg_pool2d(px, 8),
                                progress=False).cache
        text = TextEmbedCache(tmp / "text", "te")
        cache_text_embeds(self.captions.values(), text, fake_text_encoder, progress=False)
        self.assembler = BatchAssembler({"d": latents}, {"d": text})

    def micro_batch(self, names):
        samples = tuple(BatchSample("d", n, "48x32", (48, 32), self.captions[n]) for n in names)
        return MicroBatch(epoch=0, step=0, dataset_id="d", bucket="48x32", samples=samples)

    def test_shapes_values_and_order(self):
        names = ["4.png", "0.png", "2.png"]
        batch = self.assembler(self.micro_batch(names))
        self.assertEqual(tuple(batch.latents.shape), (3, 3, 4, 6))
        expected_levels = torch.tensor([self.levels[n] / 127.5 - 1 for n in names])
        self.assertTrue(torch.allclose(batch.latents.mean(dim=(1, 2, 3)), expected_levels,
                                       atol=1e-5))
        direct = fake_text_encoder([self.captions[n] for n in names])
        self.assertEqual(set(batch.prompt_embeds), set(direct))
        for name, tensor in direct.items():
            self.assertTrue(torch.equal(batch.prompt_embeds[name], tensor), name)
        # 80x40 scaled to cover 48x32 is 64x32; the centre crop starts 8 pixels in.
        self.assertEqual(batch.original_sizes, [(40, 80)] * 3)
        self.assertEqual(batch.crop_top_lefts, [(0, 8)] * 3)
        self.assertEqual(batch.target_sizes, [(32, 48)] * 3)

    def test_unknown_dataset_is_named(self):
        mb = MicroBatch(0, 0, "other", "48x32", ())
        with self.assertRaisesRegex(KeyError, "other"):
            self.assembler(mb)

    def test_sample_without_entry_says_the_cache_must_be_shared(self):
        mb = MicroBatch(0, 0, "d", "48x32",
                        (BatchSample("d", "absent.png", "48x32", (48, 32), "x"),))
        with self.assertRaisesRegex(FileNotFoundError, "absent.png.*every rank"):
            self.assembler(mb)


if __name__ == "__main__":
    unittest.main()
