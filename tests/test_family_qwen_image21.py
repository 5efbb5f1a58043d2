"""Qwen-Image 2.1 (model_family qwen_image, model_flavour v2.1): the folder's model_index.json
picks the flavour's adapter, which trains on exactly what QwenImage21Pipeline gives its
transformer (the pipeline's caption features and mask, its unpatched latents after the text, one
image slot per 2x2 tokens, timestep sigma, target noise - latents); its full and LoRA runs,
resumed, exported and loaded by the pipeline class, are the conformance suite's
(tests/conformance.py)."""

from __future__ import annotations

import unittest
from unittest import mock

import torch

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.configuration.options import TrainingConfig
from simpletuner.families.qwen_image.v21 import QwenImage21Adapter
from simpletuner.models.base import PLANNED_CAPTION, LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.activations import activation_bytes
from simpletuner.training.memory.model import meta_network
from test_memory_activations import HEIGHT, TOLERANCE, WIDTH, measured_saved_bytes

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
TINY = "tiny-qwen_image-v2.1"


class QwenImage21AdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.folder = ensure_builtin_model(TINY)
        self.adapter = get_adapter_class("qwen_image").load(
            self.folder, device=CPU, weight_dtype=torch.float32, loss_settings=LossSettings())
        self.pipeline = self.adapter.build_pipeline()

    def record(self, batch, output=None):
        """compute_loss's loss and the transformer's inputs; the network answers ``output``
        (zeros by default) for the whole joint sequence."""
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            text = inputs["encoder_hidden_states"].shape[1]
            joint = torch.zeros(inputs["hidden_states"].shape[0], text + 24, 64)
            if output:
                joint[:, -24:] = output()
            return (joint,)

        return self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=network), seen

    def test_the_folder_picks_the_flavours_adapter_and_needs_the_flavour(self):
        self.assertIsInstance(self.adapter, QwenImage21Adapter)
        self.assertEqual(guess_family(self.folder), "qwen_image")
        self.assertIsNone(QwenImage21Adapter.flavour_problem(self.folder, "v2.1"))
        self.assertIn("set model_flavour 'v2.1'",
                      QwenImage21Adapter.flavour_problem(self.folder, None))
        plain = ensure_builtin_model("tiny-qwen_image")
        self.assertIn("trains a QwenImage21Pipeline model",
                      QwenImage21Adapter.flavour_problem(plain, "v2.1"))

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        self.assertEqual(tuple(batch.latents.shape), (2, 64, 4, 6))  # 16x, 64 channels
        loss, seen = self.record(batch)
        packed_clean = self.pipeline._pack_latents(batch.latents.float(), 2, 64, 4, 6)
        sigma = seen["timestep"].view(-1, 1, 1)  # the pipeline's t / 1000
        packed_noise = (seen["hidden_states"] - (1 - sigma) * packed_clean) / sigma
        self.assertAlmostEqual(packed_noise.std().item(), 1.0, delta=0.15)
        embeds, mask, image_pad_mask = self.pipeline.encode_prompt(list(PROMPTS), device=CPU)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["encoder_hidden_states_mask"], mask.bool()))
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))
        # The image slots: none among the text, then 24 tokens / 4 for the target.
        expected = torch.cat([image_pad_mask, torch.ones(2, 6, dtype=torch.bool)], dim=1)
        self.assertTrue(torch.equal(seen["img_mask"], expected))
        self.assertEqual(seen["img_shapes"], [[(1, 4, 6)]] * 2)
        loss, _ = self.record(batch, lambda: packed_noise - packed_clean)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_the_memory_plans_captions_are_as_long_as_the_pipelines(self):
        caption = "a photograph of a red fox"
        with mock.patch("simpletuner.families.qwen_image.v21.PLANNED_CAPTION", caption):
            planned = self.adapter.planned_prompt_embeds(1)["prompt_embeds"]
        self.assertEqual(planned.shape, self.adapter.encode_prompts([caption])[
            "prompt_embeds"].shape)

    def test_the_memory_plans_activations_are_close_to_what_autograd_keeps(self):
        for model_type in ("full", "lora"):
            with self.subTest(model_type=model_type):
                training = TrainingConfig(
                    model_family="qwen_image", model_flavour="v2.1", model_type=model_type,
                    lora_rank=4, pretrained_model_name_or_path=f"builtin:{TINY}",
                    output_dir="unused", data_backend_config="unused")
                adapter = get_adapter_class("qwen_image").load(
                    self.folder, device=CPU, weight_dtype=torch.float32,
                    loss_settings=LossSettings())
                if model_type == "lora":
                    add_adapter(adapter.trainable, type(adapter), training)
                batch = random_batch(adapter, 2, HEIGHT, WIDTH, prompts=[PLANNED_CAPTION] * 2)
                measured = measured_saved_bytes(adapter, batch)
                estimate = activation_bytes(type(adapter), self.folder, training,
                                            meta_network(type(adapter), self.folder, training),
                                            batch_size=2, height=HEIGHT, width=WIDTH)
                self.assertLessEqual(abs(estimate.saved - measured) / measured, TOLERANCE,
                                     f"estimated {estimate.saved}, measured {measured}")

    def test_blocks_swap_in_forward_order(self):
        network = self.adapter.transformer
        self.assertEqual(self.adapter.swappable_blocks(network), list(network.transformer_blocks))


if __name__ == "__main__":
    unittest.main()
