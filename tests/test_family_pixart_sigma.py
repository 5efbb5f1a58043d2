"""PixArt Sigma: the transformer gets what PixArtSigmaPipeline gives it (the pipeline's T5
embeddings and mask, integer timesteps), the loss is on the noise half of its output (the
learned variance is not trained), its LoRA (injected with peft: diffusers gives PixArt's
transformer no peft methods) turns off for prior preservation, and plan --memory counts the
published 0.61 B transformer. Training, resume, export and the LoRA file: the conformance
suite (tests/conformance.py)."""

from __future__ import annotations

import json
import re
import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import TinyModelCase, network_prediction, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.models.prior_preservation import adapter_turned_off
from simpletuner.training.adapters.lora import add_lora
from simpletuner.training.reporting.model_card import model_card_text
from settings_fixtures import training_config
from test_family_chroma import CHROMA1_HD_CONFIGS
from test_family_kolors import KOLORS_CONFIGS
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
# PixArt-alpha/PixArt-Sigma-XL-2-1024-MS's configs, the parts that size the tensors: its
# transformer, SDXL's VAE, T5-XXL's encoder.
PIXART_SIGMA_CONFIGS = {
    "transformer": {"_class_name": "PixArtTransformer2DModel", "num_attention_heads": 16,
                    "attention_head_dim": 72, "in_channels": 4, "out_channels": 8,
                    "num_layers": 28, "cross_attention_dim": 1152, "caption_channels": 4096,
                    "sample_size": 128, "patch_size": 2, "use_additional_conditions": False,
                    "interpolation_scale": 2},
    "vae": KOLORS_CONFIGS["vae"],
    "text_encoder": CHROMA1_HD_CONFIGS["text_encoder"],
}
PIXART_SIGMA_PARAMETERS = 0.61e9  # "PixArt-Σ ... 0.6B parameters" (its paper)


class PixArtSigmaTest(TinyModelCase):
    def test_the_transformer_gets_what_pixartsigmapipeline_gives_it(self):
        adapter = self.load("pixart_sigma")
        seen = {}

        def keep(module, args, kwargs):
            seen.update(kwargs, hidden_states=args[0])

        hook = adapter.trainable.register_forward_pre_hook(keep, with_kwargs=True)
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        pipeline(list(PROMPTS), width=64, height=64, num_inference_steps=1, guidance_scale=1.0,
                 use_resolution_binning=False, output_type="latent")
        hook.remove()
        embeds = adapter.encode_prompts(list(PROMPTS))
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds["prompt_embeds"]))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"],
                                    embeds["prompt_attention_mask"]))
        self.assertEqual(tuple(embeds["prompt_embeds"].shape), (2, 300, 32))
        self.assertEqual(seen["timestep"].tolist(), [pipeline.scheduler.timesteps[0].item()] * 2)
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 4, 8, 8))

    def test_the_loss_is_on_the_noise_half_of_the_output(self):
        adapter = self.load("pixart_sigma")
        batch = random_batch(adapter, 2, 64, 96, prompts=PROMPTS)
        seen = {}

        def keep(module, args, kwargs, output):
            seen.update(kwargs, noisy=args[0], output=output[0])

        hook = adapter.trainable.register_forward_hook(keep, with_kwargs=True)
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(3))
        hook.remove()
        self.assertEqual(tuple(seen["output"].shape), (2, 8, 8, 12))  # noise, then variance
        alphas = adapter.noise_scheduler.alphas_cumprod[seen["timestep"]].view(-1, 1, 1, 1)
        noise = (seen["noisy"] - alphas.sqrt() * batch.latents) / (1 - alphas).sqrt()
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        expected = (seen["output"][:, :4] - noise).pow(2).mean().item()
        self.assertAlmostEqual(loss.item(), expected, places=4)
        self.assertNotAlmostEqual(loss.item(), (seen["output"] - noise.repeat(1, 2, 1, 1))
                                  .pow(2).mean().item(), places=4)

    def test_its_peft_lora_turns_off_for_prior_preservation(self):
        adapter = self.load("pixart_sigma")
        batch = random_batch(adapter, 1, prompts=PROMPTS)
        base = network_prediction(adapter, batch)
        add_lora(adapter.trainable, type(adapter), rank=4)
        with torch.no_grad():  # B starts at zero: make the adapter change something
            for name, parameter in adapter.trainable.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0, 0.5)
        self.assertFalse(torch.allclose(network_prediction(adapter, batch), base))
        with adapter_turned_off(adapter.trainable):
            self.assertTrue(torch.equal(network_prediction(adapter, batch), base))

    def test_the_lora_model_card_loads_the_file_with_peft(self):
        """PixArtSigmaPipeline has no load_lora_weights: the card says what loads the file."""
        training = training_config(model_family="pixart_sigma", model_type="lora",
                                   pretrained_model_name_or_path="/models/pixart")
        card = model_card_text(training, {"steps": 1, "seed": 0}, ["shapes"], Path("/models"))
        self.assertIn('load_peft_lora_file(pipeline.transformer, "lora/pytorch_lora_weights.'
                      'safetensors", "transformer")', card)
        self.assertNotIn("load_lora_weights", card)

    def test_the_builtin_folder_is_told_apart_as_pixart_sigma(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-pixart_sigma")), "pixart_sigma")


class PixArtSigmaMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_transformer(self):
        with tempfile.TemporaryDirectory(prefix="st-pixart-plan-") as tmp:
            root = Path(tmp)
            for subfolder, config in PIXART_SIGMA_CONFIGS.items():
                (root / "pixart" / subfolder).mkdir(parents=True)
                (root / "pixart" / subfolder / "config.json").write_text(json.dumps(config))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="pixart_sigma",
                                  pretrained_model_name_or_path=str(root / "pixart"),
                                  mixed_precision="bf16")
            output = plan_in_process(config)
        count = re.search(r"trained network: ([0-9.]+) B parameters", output).group(1)
        self.assertEqual(float(count), PIXART_SIGMA_PARAMETERS / 1e9)
        ddp, _ = row(output, "gradients")  # float32, one per parameter
        self.assertAlmostEqual(ddp / (PIXART_SIGMA_PARAMETERS * 4 / GIB), 1, delta=0.01)


if __name__ == "__main__":
    unittest.main()
