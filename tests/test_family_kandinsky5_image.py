"""Kandinsky 5.0 Image (model_family kandinsky5_image): the adapter trains on exactly what
Kandinsky5T2IPipeline gives its transformer (each caption through the pipeline's encode_prompt
alone, CLIP's pooled embedding, [B, 1, H, W, C] latents, timestep 1000 * sigma, target noise -
latents), a batch of captions of different lengths predicts what each sample alone does, the
published 6B transformer's size and block count; the i2i flavours read the caption with its
reference and the reference's channels as Kandinsky5I2IPipeline does. Training, resume and
export: the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import io
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

import torch
from diffusers import Kandinsky5Transformer3DModel

from edit_fixtures import circle
from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.cli import main
from simpletuner.families.kandinsky5_image.adapter import EverySize, Kandinsky5ImageAdapter
from simpletuner.models.base import LossSettings
from simpletuner.models.block_count import swappable_block_count
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.models.registry import get_adapter_class
from simpletuner.models.training_batch import TrainingBatch
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
# Kandinsky-5.0-T2I-Lite's transformer/config.json (kandinskylab; "6B" on its model card).
PUBLISHED = dict(in_visual_dim=16, out_visual_dim=16, time_dim=512, model_dim=2560,
                 ff_dim=10240, num_text_blocks=2, num_visual_blocks=50, axes_dims=(32, 48, 48),
                 in_text_dim=3584, in_text_dim2=768, patch_size=(1, 2, 2))


class Kandinsky5ImageAdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("kandinsky5_image")
        self.pipeline = self.adapter.build_pipeline()

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        calls = []

        def network(**inputs):
            calls.append(inputs)
            return torch.zeros_like(inputs["hidden_states"])

        self.adapter.compute_loss(batch, torch.Generator().manual_seed(3), network=network)
        self.assertEqual(len(calls), 2)  # one call per caption length
        clean = batch.latents.float()
        for prompt, seen in zip(PROMPTS, calls):
            text, pooled, _ = self.pipeline.encode_prompt(prompt, device=CPU)
            self.assertTrue(torch.equal(seen["encoder_hidden_states"], text))
            self.assertTrue(torch.equal(seen["pooled_projections"], pooled))
            self.assertTrue(torch.equal(seen["text_rope_pos"], torch.arange(text.shape[1])))
            self.assertEqual(tuple(seen["hidden_states"].shape), (1, 1, 8, 12, 16))
            self.assertEqual([len(p) for p in seen["visual_rope_pos"]], [1, 4, 6])
        # The pipeline's Euler step takes the output as noise - latents: no loss for it.
        noisy = torch.cat([seen["hidden_states"] for seen in calls]).squeeze(1)
        noisy = noisy.permute(0, 3, 1, 2)
        sigma = torch.cat([seen["timestep"] for seen in calls]).view(-1, 1, 1, 1) / 1000
        velocity = ((noisy - (1 - sigma) * clean) / sigma - clean)
        rows = iter(velocity)

        def exact(**inputs):
            return next(rows).permute(1, 2, 0)[None, None]

        loss = self.adapter.compute_loss(batch, torch.Generator().manual_seed(3), network=exact)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_a_batch_of_captions_of_different_lengths_predicts_as_each_alone(self):
        batch = random_batch(self.adapter, 2, 64, 64, prompts=PROMPTS)
        mask = batch.prompt_embeds["prompt_attention_mask"]
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))
        sigmas = torch.tensor([0.3, 0.8])
        together = self.adapter._predict(self.adapter.transformer, batch.latents, sigmas, batch,
                                         torch.float32)
        for row, prompt in enumerate(PROMPTS):
            alone = random_batch(self.adapter, 1, 64, 64, prompts=(prompt,))
            alone.latents = batch.latents[row:row + 1]
            prediction = self.adapter._predict(self.adapter.transformer, alone.latents,
                                               sigmas[row:row + 1], alone, torch.float32)
            self.assertTrue(torch.allclose(together[row:row + 1], prediction, atol=1e-5))

    def test_validation_samples_at_the_size_asked_for(self):
        self.assertIn((96, 64), self.pipeline.resolutions)
        self.assertIsInstance(self.pipeline.resolutions, EverySize)
        image = self.pipeline(prompt="a red circle", width=96, height=64, num_inference_steps=1,
                              guidance_scale=1.0, generator=torch.Generator().manual_seed(0))
        self.assertEqual(image.image[0].size, (96, 64))

    def test_the_memory_plans_captions_are_shaped_as_the_cache_holds_them(self):
        planned = self.adapter.planned_prompt_embeds(2)
        encoded = self.adapter.encode_prompts([
            "a photograph of a red fox sitting on a mossy log in a misty pine forest at dawn, "
            "soft golden light through the trees, shallow depth of field"])
        for name, tensor in encoded.items():
            self.assertEqual(planned[name].shape[1:], tensor.shape[1:], name)

    def test_blocks_swap_in_forward_order_and_the_folder_is_told_apart(self):
        network = self.adapter.transformer
        self.assertEqual(self.adapter.swappable_blocks(network),
                         [*network.text_transformer_blocks, *network.visual_transformer_blocks])
        folder = ensure_builtin_model("tiny-kandinsky5_image")
        self.assertEqual(swappable_block_count("kandinsky5_image", str(folder)), 3)
        self.assertEqual(guess_family(folder), "kandinsky5_image")


    def test_plan_memory_counts_each_flavours_network(self):
        """plan --memory (the CLI in-process) for the text-to-image and the reference flavour."""
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        make_shapes(root / "data", per_size=1, sizes=((64, 64),))
        for model, flavour in (('tiny-kandinsky5_image', None), ('tiny-kandinsky5_image-i2i', 'i2i-lite-sft')):
            with self.subTest(model=model):
                config = write_config(root, root / "data", model, model_family="kandinsky5_image",
                                      model_flavour=flavour, model_type="full",
                                      pretrained_model_name_or_path=f"builtin:{model}")
                printed = io.StringIO()
                with redirect_stdout(printed):
                    status = main(["plan", "--memory", "--config", str(config)])
                network = type(self.adapter).transformer_class.from_pretrained(
                    ensure_builtin_model(model), subfolder="transformer")
                count = sum(p.numel() for p in network.parameters()) / 1e6
                self.assertEqual(status, 0, printed.getvalue())
                self.assertIn(f"trained network: {count:.2f} M parameters", printed.getvalue())

class Kandinsky5ImageI2IAdapterTest(TinyModelCase):
    """model_flavour i2i-lite-sft: what Kandinsky5I2IPipeline gives its transformer."""

    def setUp(self):
        self.folder = ensure_builtin_model("tiny-kandinsky5_image-i2i")
        self.adapter = get_adapter_class("kandinsky5_image").load(  # the folder picks it
            self.folder, device=CPU, weight_dtype=torch.float32, loss_settings=LossSettings())
        self.pipeline = self.adapter.build_pipeline()

    def test_the_network_reads_the_caption_with_its_reference_and_its_channels(self):
        reference = circle("red", "blue", (96, 64))
        embeds = self.adapter.encode_prompts(["make it green"], [[reference]])
        text, pooled, _ = self.pipeline.encode_prompt("make it green", image=reference,
                                                      device=CPU)
        self.assertTrue(torch.equal(embeds["prompt_embeds"], text))
        self.assertTrue(torch.equal(embeds["pooled_prompt_embeds"], pooled))
        latents, condition = torch.randn(2, 1, 16, 8, 12).unbind(0)
        batch = TrainingBatch(latents=latents, prompt_embeds=embeds, original_sizes=[(64, 96)],
                              crop_top_lefts=[(0, 0)], target_sizes=[(64, 96)],
                              reference_latents=(condition,))
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            return torch.zeros_like(inputs["hidden_states"][..., :16])

        self.adapter.compute_loss(batch, torch.Generator().manual_seed(3), network=network)
        visual = seen["hidden_states"]
        self.assertEqual(tuple(visual.shape), (1, 1, 8, 12, 33))
        self.assertTrue(torch.equal(visual[..., 16:32], condition.permute(0, 2, 3, 1)[:, None]))
        self.assertTrue(torch.equal(visual[..., 32], torch.ones(1, 1, 8, 12)))

    def test_the_flavour_must_match_the_folder(self):
        plain = ensure_builtin_model("tiny-kandinsky5_image")
        adapter_class = type(self.adapter)
        self.assertIsNone(adapter_class.flavour_problem(self.folder, "i2i-lite-sft"))
        self.assertIsNone(adapter_class.flavour_problem(plain, "t2i-lite-sft"))
        self.assertIn("Kandinsky5I2IPipeline",
                      adapter_class.flavour_problem(plain, "i2i-lite-pretrain"))
        self.assertIn("i2i-lite-sft", adapter_class.flavour_problem(self.folder, None))


class PublishedSizeTest(unittest.TestCase):
    def test_the_published_transformer_has_six_billion_parameters_in_52_blocks(self):
        with torch.device("meta"):
            network = Kandinsky5Transformer3DModel(**PUBLISHED)
        self.assertAlmostEqual(sum(p.numel() for p in network.parameters()) / 1e9, 6.02,
                               places=2)
        self.assertEqual(len(Kandinsky5ImageAdapter.swappable_blocks(network)), 52)


if __name__ == "__main__":
    unittest.main()
