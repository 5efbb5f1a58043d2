"""Sana (model_family sana): the adapter gives the transformer what SanaPipeline gives it (the
pipeline's own caption features and mask from its default instruction, timestep 1000 * sigma)
and trains it on the velocity the pipeline's flow DPM-Solver steps with; full and LoRA runs of
builtin:tiny-sana are the conformance suite's (tests/conformance.py)."""

from __future__ import annotations

import unittest

import torch

from model_fixtures import TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class SanaTest(TinyModelCase):
    def test_the_network_gets_what_sanapipeline_gives_it(self):
        adapter = self.load("sana")
        seen = {}

        def keep(module, args, kwargs):
            seen.update(kwargs, hidden_states=args[0])

        hook = adapter.transformer.register_forward_pre_hook(keep, with_kwargs=True)
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        pipeline(PROMPTS[0], width=64, height=64, num_inference_steps=1, guidance_scale=1.0,
                 use_resolution_binning=False, output_type="latent")
        hook.remove()
        embeds = adapter.encode_prompts([PROMPTS[0]])
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds["prompt_embeds"]))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"],
                                    embeds["prompt_attention_mask"]))
        self.assertEqual(tuple(embeds["prompt_embeds"].shape), (1, 300, 32))
        # Its scheduler's timestep is 1000 * sigma, cut to an integer: 999 for 0.9997.
        sigma = pipeline.scheduler.sigmas[0].item()
        self.assertGreater(sigma, 0.99)
        self.assertEqual(seen["timestep"].item(), int(1000 * sigma))
        self.assertEqual(tuple(seen["hidden_states"].shape), (1, 8, 8, 8))

    def test_the_loss_is_on_the_velocity_at_timestep_1000_sigma(self):
        adapter = self.load("sana")
        batch = random_batch(adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.capture_network_inputs(adapter, batch)
        clean = batch.latents.float()
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 8, 8, 12))
        sigma = (seen["timestep"] / 1000).view(-1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        # Two captions of different lengths: the mask tells their tokens apart.
        mask = seen["encoder_attention_mask"]
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))

    def test_the_builtin_folder_is_told_apart_as_sana(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-sana")), "sana")


if __name__ == "__main__":
    unittest.main()
