"""Krea 2 (model_family krea2): the adapter trains on exactly what Krea2Pipeline gives its
transformer (the pipeline's stacked caption features and mask, its 2x2 packing and positions,
timestep sigma, target noise - latents); full and LoRA runs of builtin:tiny-krea2 through the
Trainer in-process export what Krea2Pipeline.from_pretrained loads, with the trained weights,
and the LoRA changes the base pipeline's image."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from diffusers import Krea2Pipeline

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.configuration import load_configuration
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.training.recipe import Trainer
from trained_outputs import LORA_WEIGHTS
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
FAMILY = dict(model_family="krea2", pretrained_model_name_or_path="builtin:tiny-krea2")


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


class Krea2TrainerTest(TinyModelCase):
    """A full run (with validation) and a LoRA run of two steps, in this process."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="st-krea2-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        accelerator = Accelerator(cpu=True)
        cls.trained = {}
        for name, options in (("full", dict(validation_prompt="a red circle",
                                            validation_num_inference_steps=2)),
                              ("lora", dict(model_type="lora", lora_rank=4))):
            config = write_config(cls.root, cls.root / "data", name, max_train_steps=2,
                                  learning_rate=1e-2, **FAMILY, **options)
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

    def test_the_full_run_exports_the_trained_weights_as_a_krea2pipeline(self):
        out = self.root / "full-out"
        self.assertTrue((out / "validation" / "step-2" / "grid.png").is_file())
        loaded = Krea2Pipeline.from_pretrained(out / "pipeline")
        base = Krea2Pipeline.from_pretrained(ensure_builtin_model("tiny-krea2"))
        self.assertEqual(loaded.text_encoder_select_layers, base.text_encoder_select_layers)
        exported = loaded.transformer.state_dict()
        self.assertTrue(any(not torch.equal(value, exported[key])
                            for key, value in base.transformer.state_dict().items()))
        for key, value in exported.items():
            self.assertTrue(torch.equal(value, self.trained["full"][key]), key)
        self.assertGreater(self.sample(loaded).std(), 0.0)

    def test_the_lora_file_loads_onto_the_base_pipeline_and_changes_its_image(self):
        out = self.root / "lora-out"
        self.assertFalse((out / "pipeline").exists())
        pipeline = Krea2Pipeline.from_pretrained(ensure_builtin_model("tiny-krea2"))
        before = self.sample(pipeline)
        pipeline.load_lora_weights((out / LORA_WEIGHTS).parent)
        self.assertGreater(np.abs(self.sample(pipeline) - before).mean(), 0.1)


if __name__ == "__main__":
    unittest.main()
