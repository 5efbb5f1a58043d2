"""lora_type 'lycoris' through the real trainer, with the real lycoris-lora library: a LoKr and
a LoHa run train, resume exactly, and export a LyCORIS file that LyCORIS's own
create_lycoris_from_weights puts on the base network with the trained outputs."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch
from safetensors import safe_open

from trained_outputs import ResumedAdapterRun
from training_fixtures import ResumedRunPair, environment

LOKR = {"algo": "lokr", "multiplier": 1.0, "linear_dim": 10000, "linear_alpha": 1, "factor": 4,
        "apply_preset": {"target_module": ["Attention", "FeedForward"],
                         "module_algo_map": {"Attention": {"factor": 4},
                                             "FeedForward": {"factor": 2}}}}
LOHA = {"algo": "loha", "linear_dim": 4, "linear_alpha": 2,
        "apply_preset": {"target_module": ["Attention"]}}


def _base_unet(tmp: str):
    from diffusers import UNet2DConditionModel

    from simpletuner.models.builtin import resolve_model_path

    with mock.patch.dict(os.environ, environment(tmp)):
        folder = Path(resolve_model_path("builtin:tiny-sd1x"))
    return UNet2DConditionModel.from_pretrained(folder / "unet").eval()


def _output(unet) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 4, 8, 8, generator=generator)
    context = torch.randn(1, 77, unet.config.cross_attention_dim, generator=generator)
    with torch.no_grad():
        return unet(latents, torch.tensor([500]), context).sample


class LycorisRunPair(ResumedAdapterRun, ResumedRunPair):
    """An 8-step run with ``lycoris`` as lycoris_config (two epochs) and a run resumed from its
    checkpoint-4; subclasses set the algorithm."""

    per_size, resume_step = 4, 4
    lycoris: dict

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="st-lycoris-config-")
        path = Path(cls.config_dir) / "lycoris_config.json"
        path.write_text(json.dumps(cls.lycoris))
        cls.options = dict(model_type="lora", lora_type="lycoris", lycoris_config=str(path),
                           learning_rate=5e-3, max_train_steps=8, checkpointing_steps=4,
                           lr_scheduler="cosine")
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.config_dir, ignore_errors=True)

    def test_runs_succeed(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-3000:])
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertIn("resumed from", self.resumed.stderr)

    def test_lycoris_loads_the_export_onto_the_base_with_the_trained_outputs(self):
        from lycoris import create_lycoris_from_weights

        from simpletuner.training.adapters.lora import load_adapter_weights
        from simpletuner.training.adapters.lycoris_adapter import add_lycoris

        export = self.full_out / "lora" / "pytorch_lora_weights.safetensors"
        with safe_open(str(export), "pt") as handle:
            metadata, keys = handle.metadata(), list(handle.keys())
        self.assertEqual(metadata["ss_network_module"], "lycoris.kohya")
        self.assertEqual(json.loads(metadata["lycoris_config"]), self.lycoris)
        self.assertTrue(all(k.startswith("lycoris_") for k in keys), keys[:3])
        base = _output(_base_unet(self.tmp))
        loaded_unet = _base_unet(self.tmp)
        network, _ = create_lycoris_from_weights(1.0, str(export), loaded_unet)
        network.apply_to()
        self.assertEqual(type(network.loras[0]).__name__, self.module_class)
        trained_unet = _base_unet(self.tmp)  # the trainer's adapter with the last checkpoint
        add_lycoris(trained_unet, self.lycoris, "sd1x")
        load_adapter_weights(trained_unet, self.full_out / "checkpoint-8" /
                             "lora_adapter.safetensors")
        loaded, trained = _output(loaded_unet), _output(trained_unet)
        self.assertGreater((trained - base).abs().max().item(), 1e-4, "training changed nothing")
        self.assertLessEqual((loaded - trained).abs().max().item(), 1e-5)


class LoKrRunTest(LycorisRunPair, unittest.TestCase):
    tmp_prefix, lycoris, module_class = "st-lokr-", LOKR, "LokrModule"


class LoHaRunTest(LycorisRunPair, unittest.TestCase):
    tmp_prefix, lycoris, module_class = "st-loha-", LOHA, "LohaModule"


if __name__ == "__main__":
    unittest.main()
