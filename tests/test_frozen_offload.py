"""Once the caches are complete the VAE and text encoders leave the training device; validation
brings them back for as long as it samples, then they leave again. Checked on the modules'
parameter devices, for a family with a quantized text encoder too."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import torch

from simpletuner.training.memory.offload import release_frozen_components
from simpletuner.training.reporting.validation import run_validation
from simpletuner.training.settings import OffloadSettings, ValidationSettings

from settings_fixtures import settings
from model_fixtures import CPU, TinyModelCase


def frozen_devices(adapter) -> set[torch.device]:
    modules = [adapter.vae, *adapter.text_encoders]
    return {p.device for module in modules for p in module.parameters()}


def validation_settings(output_dir: Path) -> ValidationSettings:
    return settings(ValidationSettings, validation_prompt=["a red circle", "a blue square"],
                    validation_resolution=64, validation_num_inference_steps=2,
                    validation_guidance_scale=1.0, validation_seed=0, output_dir=str(output_dir))


class FreedFrozenComponentsTest(TinyModelCase):
    """The CPU is the training device here, so "free" is the mode that takes anything away."""

    def check_family(self, family: str, **precisions):
        adapter = self.load(family)
        offload = settings(OffloadSettings, frozen_components_after_caching="free", **precisions)
        release_frozen_components(adapter, offload, torch.float32)
        self.assertEqual(frozen_devices(adapter), {torch.device("meta")})
        self.assertNotIn(CPU, frozen_devices(adapter))
        with adapter.frozen_components_on_device():
            self.assertEqual(frozen_devices(adapter), {CPU})
        self.assertEqual(frozen_devices(adapter), {torch.device("meta")})

        output = Path(self.enterContext(tempfile.TemporaryDirectory()))
        paths = run_validation(adapter, validation_settings(output), step=3)
        self.assertEqual([p.name for p in paths], ["image-00.png", "image-01.png", "grid.png"])
        self.assertTrue(all(p.stat().st_size > 0 for p in paths))
        self.assertEqual(frozen_devices(adapter), {torch.device("meta")})
        return adapter

    def test_sdxl_vae_and_both_text_encoders_are_freed_between_validations(self):
        self.check_family("sdxl")

    def test_a_quantized_text_encoder_comes_back_quantized(self):
        adapter = self.check_family("flux", text_encoder_2_precision="int8-torchao")
        with adapter.frozen_components_on_device():
            weights = [m.weight for m in adapter.text_encoders[1].modules()
                       if isinstance(m, torch.nn.Linear)]
            self.assertTrue(weights)
            self.assertTrue(all(type(w).__module__.startswith("torchao") for w in weights))

    def test_keep_leaves_them_on_the_device(self):
        adapter = self.load("sd1x")
        release_frozen_components(adapter, settings(
            OffloadSettings, frozen_components_after_caching="keep"), torch.float32)
        self.assertEqual(frozen_devices(adapter), {CPU})


if __name__ == "__main__":
    unittest.main()
