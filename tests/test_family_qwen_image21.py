"""Qwen-Image 2.1 (model_family qwen_image, model_flavour v2.1): the folder's model_index.json
picks the flavour's adapter, which trains on exactly what QwenImage21Pipeline gives its
transformer (the pipeline's caption features and mask, its unpatched latents after the text,
one image slot per 2x2 tokens, timestep sigma, target noise - latents); full and LoRA runs of
builtin:tiny-qwen_image-v2.1 through the Trainer in-process export what
QwenImage21Pipeline.from_pretrained loads, with the trained weights, and the LoRA changes the
base pipeline's image."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from accelerate import Accelerator
from diffusers import QwenImage21Pipeline

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.configuration import load_configuration
from simpletuner.configuration.options import TrainingConfig
from simpletuner.families.qwen_image.v21 import QwenImage21Adapter
from simpletuner.families.qwen_image.v21_processor import ImageTextQwen3VLProcessor
from simpletuner.models.base import PLANNED_CAPTION, LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.activations import activation_bytes
from simpletuner.training.memory.model import meta_network
from simpletuner.training.recipe import Trainer
from test_memory_activations import HEIGHT, TOLERANCE, WIDTH, measured_saved_bytes
from trained_outputs import LORA_WEIGHTS
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
TINY = "tiny-qwen_image-v2.1"
FAMILY = dict(model_family="qwen_image", model_flavour="v2.1",
              pretrained_model_name_or_path=f"builtin:{TINY}")


def load_pipeline(folder: Path) -> QwenImage21Pipeline:
    """Without torchvision, transformers cannot build Qwen3VLProcessor's video part: the
    processor is passed in (v21_processor.py)."""
    return QwenImage21Pipeline.from_pretrained(folder, processor=(
        ImageTextQwen3VLProcessor.from_pretrained(folder, subfolder="processor")))


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


class QwenImage21TrainerTest(TinyModelCase):
    """A full run (with validation) and a LoRA run of two steps, in this process."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="st-qwen21-"))
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
                                  aspect_bucket_alignment=32, **FAMILY, **settings)
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

    def test_the_full_run_exports_the_trained_weights_as_a_qwenimage21pipeline(self):
        out = self.root / "full-out"
        self.assertTrue((out / "validation" / "step-2" / "grid.png").is_file())
        loaded = load_pipeline(out / "pipeline")
        base = load_pipeline(ensure_builtin_model(TINY))
        exported = loaded.transformer.state_dict()
        self.assertTrue(any(not torch.equal(value, exported[key])
                            for key, value in base.transformer.state_dict().items()))
        for key, value in exported.items():
            self.assertTrue(torch.equal(value, self.trained["full"][key]), key)
        self.assertGreater(self.sample(loaded).std(), 0.0)

    def test_the_lora_file_loads_onto_the_base_pipeline_and_changes_its_image(self):
        out = self.root / "lora-out"
        self.assertFalse((out / "pipeline").exists())
        pipeline = load_pipeline(ensure_builtin_model(TINY))
        before = self.sample(pipeline)
        pipeline.load_lora_weights((out / LORA_WEIGHTS).parent)
        self.assertGreater(np.abs(self.sample(pipeline) - before).mean(), 0.1)


if __name__ == "__main__":
    unittest.main()
