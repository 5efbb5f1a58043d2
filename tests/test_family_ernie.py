"""ERNIE-Image (model_family ernie): the adapter trains on exactly what ErnieImagePipeline gives
its transformer (the pipeline's unpadded caption features, padded and counted as its _pad_text
does, its patchified normalised latents, timestep 1000 * sigma, target noise - latents); full
and LoRA runs of builtin:tiny-ernie through the Trainer in-process export what
ErnieImagePipeline.from_pretrained loads, with the trained weights, and the LoRA changes the
base pipeline's image."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from diffusers import ErnieImagePipeline

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.configuration import load_configuration
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.training.recipe import Trainer
from trained_outputs import LORA_WEIGHTS
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
FAMILY = dict(model_family="ernie", pretrained_model_name_or_path="builtin:tiny-ernie")


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


class ErnieTrainerTest(TinyModelCase):
    """A full run (with validation) and a LoRA run of two steps, in this process."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="st-ernie-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        accelerator = Accelerator(cpu=True)
        cls.trained = {}
        for name, options in (("full", dict(validation_prompt="a red circle",
                                            validation_num_inference_steps=2)),
                              # a rate at which two steps move the tiny image visibly
                              ("lora", dict(model_type="lora", lora_rank=4,
                                            learning_rate=5e-2))):
            settings = {"learning_rate": 1e-2, **options}
            config = write_config(cls.root, cls.root / "data", name, max_train_steps=2,
                                  **FAMILY, **settings)
            trainer = Trainer(load_configuration(config), accelerator)
            trainer.run()
            cls.trained[name] = {key: value.detach().clone() for key, value
                                 in trainer.parts.network.state_dict().items()}

    def sample(self, pipeline) -> np.ndarray:
        pipeline.set_progress_bar_config(disable=True)
        image = pipeline(prompt="a red circle", width=64, height=64, num_inference_steps=2,
                         generator=torch.Generator().manual_seed(0)).images[0]
        self.assertEqual(image.size, (64, 64))
        return np.asarray(image).astype(np.float64)

    def test_the_full_run_exports_the_trained_weights_as_an_ernieimagepipeline(self):
        out = self.root / "full-out"
        self.assertTrue((out / "validation" / "step-2" / "grid.png").is_file())
        loaded = ErnieImagePipeline.from_pretrained(out / "pipeline")
        base = ErnieImagePipeline.from_pretrained(ensure_builtin_model("tiny-ernie"))
        exported = loaded.transformer.state_dict()
        self.assertTrue(any(not torch.equal(value, exported[key])
                            for key, value in base.transformer.state_dict().items()))
        for key, value in exported.items():
            self.assertTrue(torch.equal(value, self.trained["full"][key]), key)
        self.assertGreater(self.sample(loaded).std(), 0.0)

    def test_the_lora_file_loads_onto_the_base_pipeline_and_changes_its_image(self):
        out = self.root / "lora-out"
        self.assertFalse((out / "pipeline").exists())
        pipeline = ErnieImagePipeline.from_pretrained(ensure_builtin_model("tiny-ernie"))
        before = self.sample(pipeline)
        pipeline.load_lora_weights((out / LORA_WEIGHTS).parent)
        self.assertGreater(np.abs(self.sample(pipeline) - before).mean(), 0.1)


if __name__ == "__main__":
    unittest.main()
