"""LongCat-Image (model_family longcat_image): the adapter trains on exactly what
LongCatImagePipeline gives its transformer (the pipeline's 512-token caption features and text
ids, its packed latents and image ids, timestep sigma, target noise - latents); its pipeline has
no LoRA loader, so the export is written by diffusers' shared LoRA writer and init_lora reads a
file through the transformer's own load_lora_adapter; model_flavour edit reads the caption with
its reference and appends the reference's tokens as LongCatImageEditPipeline does. Training,
resume and export: the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import io
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

import torch
from diffusers.pipelines.longcat_image.pipeline_longcat_image_edit import calculate_dimensions

from edit_fixtures import circle
from model_fixtures import CPU, TinyModelCase, network_prediction, random_batch, train_adapter
from simpletuner.cli import main
from simpletuner.models.base import LossSettings
from simpletuner.models.block_count import swappable_block_count
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.models.registry import get_adapter_class
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.training.adapters.lora import add_lora, export_lora
from simpletuner.training.adapters.lora_init import init_adapter
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class LongCatImageAdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("longcat_image")
        self.pipeline = self.adapter.build_pipeline()

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        self.adapter.compute_loss(batch, torch.Generator().manual_seed(3), network=network)
        text, text_ids = self.pipeline.encode_prompt(list(PROMPTS))
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], text))
        self.assertTrue(torch.equal(seen["txt_ids"], text_ids))
        _, image_ids = self.pipeline.prepare_latents(2, 16, 64, 96, torch.float32, CPU, None)
        self.assertTrue(torch.equal(seen["img_ids"], image_ids))
        clean = self.pipeline._pack_latents(batch.latents.float(), 2, 16, 8, 12)
        sigma = seen["timestep"].view(-1, 1, 1)  # the pipeline's t / 1000
        velocity = (seen["hidden_states"] - (1 - sigma) * clean) / sigma - clean
        # The pipeline's Euler step takes the output as noise - latents: no loss for it.
        loss = self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=lambda **inputs: (velocity,))
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_validation_reads_the_prompt_as_written(self):
        self.assertFalse(self.adapter.validation_arguments({})["enable_prompt_rewrite"])

    def test_the_export_starts_an_init_lora_adapter_with_its_update(self):
        batch = random_batch(self.adapter, 2, seed=0, prompts=("a", "b"))
        add_lora(self.adapter.trainable, type(self.adapter), rank=4, alpha=8)
        train_adapter(self.adapter, batch)
        expected = network_prediction(self.adapter, batch)
        with tempfile.TemporaryDirectory() as folder:
            path = export_lora(type(self.adapter), self.adapter.trainable, Path(folder))
            run = self.load("longcat_image")
            add_lora(run.trainable, type(run), rank=4, alpha=2)
            before = network_prediction(run, batch)
            init_adapter(run, path)
        self.assertGreater((expected - before).abs().max().item(), 1e-5)
        self.assertLessEqual((network_prediction(run, batch) - expected).abs().max().item(),
                             1e-5)

    def test_the_memory_plans_captions_are_shaped_as_the_cache_holds_them(self):
        planned = self.adapter.planned_prompt_embeds(2)
        for name, tensor in self.adapter.encode_prompts(list(PROMPTS)).items():
            self.assertEqual(planned[name].shape, tensor.shape, name)

    def test_blocks_swap_in_forward_order_and_the_folder_is_told_apart(self):
        network = self.adapter.transformer
        self.assertEqual(self.adapter.swappable_blocks(network),
                         [*network.transformer_blocks, *network.single_transformer_blocks])
        folder = ensure_builtin_model("tiny-longcat_image")
        self.assertEqual(swappable_block_count("longcat_image", str(folder)), 2)
        self.assertEqual(guess_family(folder), "longcat_image")


    def test_plan_memory_counts_each_flavours_network(self):
        """plan --memory (the CLI in-process) for the text-to-image and the reference flavour."""
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        make_shapes(root / "data", per_size=1, sizes=((64, 64),))
        for model, flavour in (('tiny-longcat_image', None), ('tiny-longcat_image-edit', 'edit')):
            with self.subTest(model=model):
                config = write_config(root, root / "data", model, model_family="longcat_image",
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

class LongCatImageEditAdapterTest(TinyModelCase):
    """model_flavour edit: what LongCatImageEditPipeline gives its transformer for a pair."""

    def setUp(self):
        torch.manual_seed(0)
        self.folder = ensure_builtin_model("tiny-longcat_image-edit")
        self.adapter = get_adapter_class("longcat_image").load(  # the folder picks the edit one
            self.folder, device=CPU, weight_dtype=torch.float32, loss_settings=LossSettings())
        self.assertEqual(type(self.adapter).__name__, "LongCatImageEditAdapter")
        self.pipeline = self.adapter.build_pipeline()

    def test_the_network_reads_the_caption_with_its_reference_and_the_references_tokens(self):
        reference = circle("red", "blue", (96, 64))
        embeds = self.adapter.encode_prompts(["make it green"], [[reference]])
        width, height = calculate_dimensions(1024 * 1024, 96 / 64)  # the pipeline's 1 MP
        resized = self.pipeline.image_processor.resize(reference, height, width)
        prompt_image = self.pipeline.image_processor.resize(resized, height // 2, width // 2)
        text, text_ids = self.pipeline.encode_prompt(["make it green"], image=prompt_image)
        self.assertTrue(torch.equal(embeds["prompt_embeds"], text))
        latents = torch.randn(1, 16, 8, 12, generator=torch.Generator().manual_seed(1))
        batch = TrainingBatch(latents=latents, prompt_embeds=embeds, original_sizes=[(64, 96)],
                              crop_top_lefts=[(0, 0)], target_sizes=[(64, 96)],
                              reference_latents=(torch.randn(1, 16, 8, 12),))
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        self.adapter.compute_loss(batch, torch.Generator().manual_seed(3), network=network)
        self.assertTrue(torch.equal(seen["txt_ids"], text_ids))
        _, packed, ids, reference_ids = self.pipeline.prepare_latents(
            batch.reference_latents[0], 1, 16, 64, 96, torch.float32, text.shape[1], CPU, None)
        self.assertTrue(torch.equal(seen["img_ids"], torch.cat([ids, reference_ids.float()])))
        self.assertTrue(torch.equal(seen["hidden_states"][:, 24:], packed))
        self.assertEqual(seen["hidden_states"].shape[1], 48)

    def test_the_flavour_must_match_the_folder(self):
        plain = ensure_builtin_model("tiny-longcat_image")
        adapter_class = type(self.adapter)
        self.assertIsNone(adapter_class.flavour_problem(self.folder, "edit"))
        self.assertIsNone(adapter_class.flavour_problem(plain, None))
        self.assertIn("LongCatImageEditPipeline", adapter_class.flavour_problem(plain, "edit"))
        self.assertIn("model_flavour 'edit'", adapter_class.flavour_problem(self.folder, None))


if __name__ == "__main__":
    unittest.main()
