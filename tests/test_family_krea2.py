"""Krea 2 (model_family krea2): the adapter trains on exactly what Krea2Pipeline gives its
transformer (the pipeline's stacked caption features and mask, its 2x2 packing and positions,
timestep sigma, target noise - latents); its full and LoRA runs, resumed, exported and loaded by
the pipeline class, are the conformance suite's (tests/conformance.py)."""

from __future__ import annotations

import unittest

import torch
from diffusers import Krea2Pipeline

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class Krea2AdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("krea2")
        self.pipeline = self.adapter.build_pipeline()

    def record(self, batch, output=None):
        """compute_loss's loss and the transformer's inputs; the network answers ``output``
        (zeros by default)."""
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            return (output() if output else torch.zeros_like(inputs["hidden_states"]),)

        return self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=network), seen

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.record(batch)
        clean = batch.latents.float()  # [2, 16, 8, 12]
        sigma = seen["timestep"].view(-1, 1, 1, 1)  # the pipeline's t / 1000
        packed_clean = self.pipeline._pack_latents(clean, 2, 16, 8, 12)
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 24, 64))
        packed_noise = (seen["hidden_states"] - (1 - sigma.view(-1, 1, 1)) * packed_clean) \
            / sigma.view(-1, 1, 1)
        self.assertAlmostEqual(packed_noise.std().item(), 1.0, delta=0.15)
        # The captions, their mask and the positions are Krea2Pipeline's own.
        embeds, mask = self.pipeline.encode_prompt(list(PROMPTS), device=CPU)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"], mask))
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))
        self.assertTrue(torch.equal(seen["position_ids"], Krea2Pipeline.prepare_position_ids(
            embeds.shape[1], 4, 6, CPU)))
        # The pipeline's Euler step takes the output as noise - latents: no loss for it.
        loss, _ = self.record(batch, lambda: packed_noise - packed_clean)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_the_memory_plans_captions_are_shaped_as_the_cache_holds_them(self):
        planned = self.adapter.planned_prompt_embeds(2)
        encoded = self.adapter.encode_prompts(list(PROMPTS))
        for name, tensor in encoded.items():
            self.assertEqual(planned[name].shape, tensor.shape, name)

    def test_blocks_swap_in_forward_order_and_the_folder_is_told_apart(self):
        network = self.adapter.transformer
        self.assertEqual(self.adapter.swappable_blocks(network), list(network.transformer_blocks))
        self.assertEqual(guess_family(ensure_builtin_model("tiny-krea2")), "krea2")


if __name__ == "__main__":
    unittest.main()
