"""vae_batch_size: prepare_caches encodes each bucket's latents in batches of that size."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.caching.prepare import prepare_caches
from test_caching import BUCKETS, SIZES, make_index, write_dataset


class VaeBatchSizeTest(unittest.TestCase):
    def test_each_bucket_is_encoded_in_batches_of_vae_batch_size(self):
        accelerator = Accelerator(cpu=True)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_dataset(root / "data", SIZES)
            for component in ("vae", "text_encoder", "tokenizer"):
                (root / "model" / component).mkdir(parents=True)
                (root / "model" / component / "config.json").write_text("{}")
            batches = []

            def encode_images(pixels: torch.Tensor) -> torch.Tensor:
                batches.append(pixels.shape[0])
                return F.avg_pool2d(pixels, 8)

            dataset = DatasetConfig(id="shapes", instance_data_dir=str(root / "data"))
            prepare_caches([dataset], {"shapes": make_index(SIZES, BUCKETS)},
                           {"shapes": lambda sample_id: "a caption"}, encode_images,
                           lambda prompts: {"prompt_embeds": torch.ones(len(prompts), 2, 3)},
                           model_folder=root / "model", family="sd1x",
                           output_dir=root / "output", seed=0,
                           rank=accelerator.process_index,
                           world_size=accelerator.num_processes, vae_batch_size=3,
                           progress=False)
        # Three buckets of four images: 3 + 1 each.
        self.assertEqual(sorted(batches), [1, 1, 1, 3, 3, 3])


if __name__ == "__main__":
    unittest.main()
