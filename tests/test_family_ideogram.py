"""Ideogram 4 (model_family ideogram): the adapter trains on exactly what Ideogram4Pipeline gives
its conditional transformer (the pipeline's caption features, ids and 2x2 token packing,
timestep 1 - sigma, its sign); full and LoRA runs of builtin:tiny-ideogram through the Trainer
in-process export what Ideogram4Pipeline.from_pretrained loads, with the trained weights and the
unconditional transformer as loaded, and the LoRA changes the base pipeline's image. The
Trainer's validation is not run here: the pipeline pads every prompt to 2048 tokens for a
36-layer text encoder, minutes on two CPU cores; the test samples with a shorter padding."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from diffusers import Ideogram4Pipeline

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.configuration import load_configuration
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.training.recipe import Trainer
from trained_outputs import LORA_WEIGHTS
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
FAMILY = dict(model_family="ideogram", pretrained_model_name_or_path="builtin:tiny-ideogram")


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


class IdeogramTrainerTest(TinyModelCase):
    """A full run and a LoRA run of two steps, in this process."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="st-ideogram-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        accelerator = Accelerator(cpu=True)
        cls.trained = {}
        for name, options in (("full", {}),
                              # a rate at which two steps move the tiny image visibly
                              ("lora", dict(model_type="lora", lora_rank=4,
                                            learning_rate=5e-2))):
            settings = {"learning_rate": 1e-2, "validation_prompt": None, **options}
            config = write_config(cls.root, cls.root / "data", name, max_train_steps=2,
                                  **FAMILY, **settings)
            trainer = Trainer(load_configuration(config), accelerator)
            trainer.run()
            cls.trained[name] = {key: value.detach().clone() for key, value
                                 in trainer.parts.network.state_dict().items()}

    def sample(self, pipeline) -> np.ndarray:
        pipeline.set_progress_bar_config(disable=True)
        image = pipeline(prompt="a red circle", width=64, height=64, num_inference_steps=2,
                         max_sequence_length=64, guidance_scale=3.0, guidance_schedule=None,
                         generator=torch.Generator().manual_seed(0)).images[0]
        self.assertEqual(image.size, (64, 64))
        return np.asarray(image).astype(np.float64)

    def test_the_full_run_exports_the_trained_weights_as_an_ideogram4pipeline(self):
        loaded = Ideogram4Pipeline.from_pretrained(self.root / "full-out" / "pipeline")
        base = Ideogram4Pipeline.from_pretrained(ensure_builtin_model("tiny-ideogram"))
        exported = loaded.transformer.state_dict()
        self.assertTrue(any(not torch.equal(value, exported[key])
                            for key, value in base.transformer.state_dict().items()))
        for key, value in exported.items():
            self.assertTrue(torch.equal(value, self.trained["full"][key]), key)
        unconditional = loaded.unconditional_transformer.state_dict()
        for key, value in base.unconditional_transformer.state_dict().items():
            self.assertTrue(torch.equal(value, unconditional[key]), key)
        self.assertGreater(self.sample(loaded).std(), 0.0)

    def test_the_lora_file_loads_onto_the_base_pipeline_and_changes_its_image(self):
        out = self.root / "lora-out"
        self.assertFalse((out / "pipeline").exists())
        pipeline = Ideogram4Pipeline.from_pretrained(ensure_builtin_model("tiny-ideogram"))
        before = self.sample(pipeline)
        pipeline.load_lora_weights((out / LORA_WEIGHTS).parent)
        self.assertGreater(np.abs(self.sample(pipeline) - before).mean(), 0.1)


if __name__ == "__main__":
    unittest.main()
