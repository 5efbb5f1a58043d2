"""Lumina 2 (model_family lumina2): the adapter learns and trains on exactly what Lumina2Pipeline
gives its transformer (the pipeline's own caption features and mask, timestep 1 - sigma, its
sign); its full and LoRA runs, resumed, exported and loaded by the pipeline class, are the
conformance suite's (tests/conformance.py)."""

from __future__ import annotations

import unittest

import torch

from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.training.adapters.lora import add_lora

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class Lumina2AdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("lumina2")

    def record(self, batch, output=None):
        """compute_loss's loss and the transformer's inputs; the network answers ``output``
        (zeros by default)."""
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            hidden = inputs["hidden_states"]
            return (output() if output else torch.zeros_like(hidden),)

        return self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=network), seen

    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        before, after = losses_around_training(self.adapter, random_batch(self.adapter, 4),
                                               lr=2e-3, steps=60)
        self.assertLess(after, 0.75 * before, f"{before} -> {after}")

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.record(batch)
        clean = batch.latents.float()
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 16, 8, 12))
        sigma = (1 - seen["timestep"]).view(-1, 1, 1, 1)  # the pipeline's 1 - t / 1000
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.1)
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        # The captions and their mask are Lumina2Pipeline.encode_prompt's own.
        embeds, mask, _, _ = self.adapter.build_pipeline().encode_prompt(
            list(PROMPTS), do_classifier_free_guidance=False, device=CPU)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"], mask))
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))
        # The pipeline steps with minus the output: a network answering latents - noise has
        # no loss.
        loss, _ = self.record(batch, lambda: clean - noise)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_default_lora_targets_are_every_blocks_attention_projections(self):
        network = self.adapter.transformer
        add_lora(network, type(self.adapter), rank=2)
        wrapped = {name.rsplit(".lora_A", 1)[0] for name, _ in network.named_parameters()
                   if ".lora_A." in name}
        blocks = len(network.noise_refiner) + len(network.context_refiner) + len(network.layers)
        self.assertEqual(len(wrapped), 4 * blocks)
        self.assertTrue(all(".attn." in name for name in wrapped), wrapped)

    def test_the_builtin_folder_is_told_apart_as_lumina2(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-lumina2")), "lumina2")



if __name__ == "__main__":
    unittest.main()
