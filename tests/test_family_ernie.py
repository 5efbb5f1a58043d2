"""ERNIE-Image (model_family ernie): the adapter trains on exactly what ErnieImagePipeline gives
its transformer (the pipeline's unpadded caption features, padded and counted as its _pad_text
does, its patchified normalised latents, timestep 1000 * sigma, target noise - latents); full
and LoRA runs of builtin:tiny-ernie through the Trainer in-process export what
ErnieImagePipeline.from_pretrained loads, with the trained weights, and the LoRA changes the
base pipeline's image.; its full and LoRA runs, resumed, exported and loaded by the pipeline
class, are the conformance suite's (tests/conformance.py)."""

from __future__ import annotations

import unittest

import torch
from diffusers import ErnieImagePipeline

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class ErnieAdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("ernie")
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
        clean = batch.latents.float()
        # 16x: the VAE's 8x and the 2x2 patchify into 4 * 8 channels
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 32, 4, 6))
        sigma = (seen["timestep"] / 1000).view(-1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        # The captions are the pipeline's encode_prompt, each prompt alone, padded by _pad_text.
        hiddens = self.pipeline.encode_prompt(list(PROMPTS), CPU)
        self.assertNotEqual(hiddens[0].shape[0], hiddens[1].shape[0])
        text, lengths = ErnieImagePipeline._pad_text(hiddens, CPU, torch.float32,
                                                     hiddens[0].shape[-1])
        self.assertTrue(torch.equal(seen["text_bth"], text))
        self.assertTrue(torch.equal(seen["text_lens"], lengths))
        # The pipeline's Euler step takes the output as noise - latents: no loss for it.
        loss, _ = self.record(batch, lambda: noise - clean)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_latents_decode_back_through_the_pipelines_own_inverse(self):
        pixels = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(2)) * 2 - 1
        latents = self.adapter.encode_images(pixels)
        raw = self.adapter.vae.encode(pixels).latent_dist.mode()
        bn = self.adapter.vae.bn
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + 1e-5)
        restored = latents * std + bn.running_mean.view(1, -1, 1, 1)
        self.assertTrue(torch.allclose(ErnieImagePipeline._unpatchify_latents(restored), raw,
                                       atol=1e-5))

    def test_the_memory_plan_counts_the_captions_tokens(self):
        planned = self.adapter.planned_prompt_embeds(2)["prompt_embeds"]
        caption = "a photograph of a red fox"
        tokens = len(self.adapter.tokenizers[0](caption).input_ids)
        self.assertEqual(tokens, len(caption) + 2)  # BOS, "▁", then one token per character
        self.assertEqual(planned.shape[-1], self.adapter.encode_prompts(["x"])[
            "prompt_embeds"].shape[-1])

    def test_blocks_swap_in_forward_order_and_the_folder_is_told_apart(self):
        network = self.adapter.transformer
        self.assertEqual(self.adapter.swappable_blocks(network), list(network.layers))
        self.assertEqual(guess_family(ensure_builtin_model("tiny-ernie")), "ernie")


if __name__ == "__main__":
    unittest.main()
