"""AuraFlow (model_family auraflow): the adapter gives the transformer what AuraFlowPipeline
gives it (the pipeline's own UMT5 features with the padding zeroed, sigma as the timestep) and
trains it on the velocity the pipeline's Euler scheduler steps with; full and LoRA runs of
builtin:tiny-auraflow are the conformance suite's (tests/conformance.py)."""

from __future__ import annotations

import unittest

import torch

from model_fixtures import TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class AuraFlowTest(TinyModelCase):
    def test_the_network_gets_what_auraflowpipeline_gives_it(self):
        adapter = self.load("auraflow")
        seen = {}

        def keep(module, args, kwargs):
            seen.update(kwargs, hidden_states=args[0])

        hook = adapter.transformer.register_forward_pre_hook(keep, with_kwargs=True)
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        pipeline(PROMPTS[0], width=64, height=64, num_inference_steps=1, guidance_scale=1.0,
                 output_type="latent")
        hook.remove()
        embeds = adapter.encode_prompts([PROMPTS[0]])["prompt_embeds"]
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertEqual(tuple(embeds.shape), (1, 256, 32))
        # The padding after the caption's tokens (and </s>) reads as zeros.
        tokens = len(pipeline.tokenizer(PROMPTS[0]).input_ids)
        self.assertTrue(torch.all(embeds[0, tokens:] == 0))
        self.assertTrue(torch.all(embeds[0, :tokens].abs().sum(-1) > 0))
        # Its timestep is the scheduler's sigma (t / 1000): 1 at the first step.
        sigma = pipeline.scheduler.sigmas[0].item()
        self.assertAlmostEqual(seen["timestep"].item(), sigma, places=6)
        self.assertAlmostEqual(sigma, 1.0, places=6)
        self.assertEqual(tuple(seen["hidden_states"].shape), (1, 4, 8, 8))

    def test_the_loss_is_on_the_velocity_at_timestep_sigma(self):
        adapter = self.load("auraflow")
        batch = random_batch(adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.capture_network_inputs(adapter, batch)
        clean = batch.latents.float()
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 4, 8, 12))
        sigma = seen["timestep"].view(-1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        self.assertNotIn("encoder_attention_mask", seen)

    def test_the_builtin_folder_is_told_apart_as_auraflow(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-auraflow")), "auraflow")


if __name__ == "__main__":
    unittest.main()
