"""Ideogram 4 (model_family ideogram): the adapter trains on exactly what Ideogram4Pipeline gives
its conditional transformer (the pipeline's caption features, ids and 2x2 token packing,
timestep 1 - sigma, its sign); its full and LoRA runs, resumed, exported and loaded by the
pipeline class, are the conformance suite's (tests/conformance.py)."""

from __future__ import annotations

import unittest

import torch

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class IdeogramAdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("ideogram")
        self.pipeline = self.adapter.build_pipeline()

    def record(self, batch, output=None):
        """compute_loss's loss and the transformer's inputs; the network answers ``output``
        for the image tokens (zeros by default)."""
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            answer = torch.zeros_like(inputs["hidden_states"])
            if output:
                answer[:, -24:] = output()
            return (answer,)

        return self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=network), seen

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.record(batch)
        # The pipeline's own layout for a 4 x 6 token grid, padded to the longest prompt.
        text = int(batch.prompt_embeds["prompt_embeds_mask"].sum(dim=1).max())
        features, positions, segments, roles = self.pipeline.encode_prompt(
            list(PROMPTS), 4, 6, max_sequence_length=text, device=CPU)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], features))
        for name, expected in (("position_ids", positions), ("segment_ids", segments),
                               ("indicator", roles)):
            self.assertTrue(torch.equal(seen[name], expected), name)
        self.assertTrue(torch.equal(seen["hidden_states"][:, :text],
                                    torch.zeros(2, text, 32)))
        # Tokens in the order the pipeline unpacks them: (row, column) of the grid.
        image = seen["hidden_states"][:, text:]
        clean = batch.latents.flatten(2).transpose(1, 2)
        sigma = (1 - seen["timestep"]).view(-1, 1, 1)  # the pipeline's model time
        noise = (image - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        # The pipeline steps with minus the output: latents - noise has no loss.
        loss, _ = self.record(batch, lambda: clean - noise)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_latents_decode_through_the_pipelines_own_unpacking(self):
        pixels = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(2)) * 2 - 1
        tokens = self.adapter.encode_images(pixels).flatten(2).transpose(1, 2)
        bn, vae = self.adapter.vae.bn, self.adapter.vae
        z = tokens * torch.sqrt(bn.running_var + vae.config.batch_norm_eps) + bn.running_mean
        z = z.view(1, 4, 6, 2, 2, 8).permute(0, 5, 1, 3, 2, 4).reshape(1, 8, 8, 12)
        self.assertTrue(torch.allclose(z, vae.encode(pixels).latent_dist.mode(), atol=1e-5))

    def test_validation_guidance_replaces_the_pipelines_schedule(self):
        arguments = self.adapter.validation_arguments({"guidance_scale": 3.0})
        self.assertEqual(arguments, {"guidance_scale": 3.0, "guidance_schedule": None})
        self.pipeline.set_progress_bar_config(disable=True)
        calls = []
        hook = self.pipeline.unconditional_transformer.register_forward_hook(
            lambda *_: calls.append(1))
        self.addCleanup(hook.remove)
        self.pipeline(prompt="a red circle", height=32, width=32, num_inference_steps=2,
                      max_sequence_length=64, **arguments)
        self.assertEqual(len(calls), 2)  # the unconditional transformer, every step

    def test_blocks_swap_in_forward_order_and_the_folder_is_told_apart(self):
        network = self.adapter.transformer
        self.assertEqual(self.adapter.swappable_blocks(network), list(network.layers))
        self.assertEqual(guess_family(ensure_builtin_model("tiny-ideogram")), "ideogram")


if __name__ == "__main__":
    unittest.main()
