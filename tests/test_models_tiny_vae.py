"""The built-in SD VAE is a real (if blurry) autoencoder with unit-scale latents, so the demo's
validation images can show what the UNet learned; and outdated cached builds are replaced."""

from __future__ import annotations

import io
import json
import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from diffusers import AutoencoderKL
from PIL import Image

from simpletuner.demo_data import demo_images, render
from simpletuner.models.builtin import VERSION_FILE, ensure_builtin_model

# Measured on the demo images: 0.04 to 0.055 for the pretrained VAE, 0.6 to 0.7 for a random one.
MAX_RECONSTRUCTION_MSE = 0.1


def _demo_batch(size: tuple[int, int], count: int) -> torch.Tensor:
    """Demo images (drawn by the demo's own renderer, not the VAE's training generator) of one
    size, in [-1, 1]."""
    chosen = [image for image in demo_images() if image.size == size][:count]
    arrays = [np.asarray(Image.open(io.BytesIO(render(image))).convert("RGB"))
              for image in chosen]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 127.5 - 1


class TinyVAETest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cache = cls.enterClassContext(tempfile.TemporaryDirectory())
        cls.enterClassContext(mock.patch.dict(os.environ, {"SIMPLETUNER_CACHE": cache}))
        cls.folder = ensure_builtin_model("tiny-sd1x")
        cls.vae = AutoencoderKL.from_pretrained(cls.folder, subfolder="vae").eval()

    @torch.no_grad()
    def _reconstruction_mse(self, vae: AutoencoderKL, pixels: torch.Tensor) -> float:
        latents = vae.encode(pixels).latent_dist.mode()
        return torch.nn.functional.mse_loss(vae.decode(latents).sample, pixels).item()

    def test_demo_images_are_reconstructed_far_better_than_by_a_random_vae(self):
        torch.manual_seed(0)
        random_vae = AutoencoderKL.from_config(self.vae.config).eval()
        for size in ((64, 64), (96, 64)):
            with self.subTest(size=size):
                pixels = _demo_batch(size, 8)
                trained = self._reconstruction_mse(self.vae, pixels)
                untrained = self._reconstruction_mse(random_vae, pixels)
                self.assertLess(trained, MAX_RECONSTRUCTION_MSE)
                self.assertLess(trained, untrained / 5)

    @torch.no_grad()
    def test_scaled_latents_have_about_unit_std(self):
        pixels = _demo_batch((64, 64), 16)
        latents = self.vae.encode(pixels).latent_dist.mode() * self.vae.config.scaling_factor
        self.assertGreater(latents.std().item(), 0.5)
        self.assertLess(latents.std().item(), 2.0)

    def test_an_outdated_cached_build_is_rebuilt(self):
        with tempfile.TemporaryDirectory() as cache:
            with mock.patch.dict(os.environ, {"SIMPLETUNER_CACHE": cache}):
                folder = ensure_builtin_model("tiny-sd1x")
                marker = folder / VERSION_FILE
                marker.write_text(json.dumps({"builtin": "tiny-sd1x", "version": 1}))
                stale_file = folder / "left-by-the-old-build"
                stale_file.write_text("old")
                self.assertEqual(ensure_builtin_model("tiny-sd1x"), folder)
                self.assertFalse(stale_file.exists())
                self.assertNotEqual(json.loads(marker.read_text())["version"], 1)
                leftovers = [p.name for p in Path(cache, "builtin").iterdir()
                             if p.name != "tiny-sd1x"]
                self.assertEqual(leftovers, [])


if __name__ == "__main__":
    unittest.main()
