"""Validation images and exported pipelines, for every family."""

from __future__ import annotations

import copy
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from diffusers import DiffusionPipeline
from PIL import Image

from model_fixtures import TinyModelCase, random_batch
from simpletuner.models.pipelines import (
    export_pipeline, generate_validation_images, save_validation_images)


class PipelineCase(TinyModelCase):
    def setUp(self):
        self.output = Path(self.enterContext(tempfile.TemporaryDirectory()))

    def train_one_step(self, adapter):
        """Change the weights so an export of the original model would be caught."""
        batch = random_batch(adapter, 2, seed=0, prompts=("a", "b"))
        optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=1e-2)
        adapter.compute_loss(batch, torch.Generator().manual_seed(0)).backward()
        optimizer.step()


class ExportTest(PipelineCase):
    def test_export_loads_in_diffusers_with_the_trained_weights_and_generates(self):
        expected_class = {"sd1x": "StableDiffusionPipeline", "sd2x": "StableDiffusionPipeline",
                          "sdxl": "StableDiffusionXLPipeline"}
        for family, class_name in expected_class.items():
            with self.subTest(family=family):
                adapter = self.load(family)
                self.train_one_step(adapter)
                folder = export_pipeline(adapter.build_pipeline(), self.output / family)
                self.assertEqual(folder, self.output / family / "pipeline")
                self.assert_export_loads(adapter, folder, class_name, 80, 48)

    def test_second_export_replaces_the_first_and_leaves_no_temporary_folders(self):
        adapter = self.load("sd1x")
        export_pipeline(adapter.build_pipeline(), self.output)
        self.train_one_step(adapter)
        folder = export_pipeline(adapter.build_pipeline(), self.output)
        self.assertEqual([p.name for p in self.output.iterdir()], ["pipeline"])
        loaded = DiffusionPipeline.from_pretrained(folder)
        name, weight = next(iter(adapter.trainable.state_dict().items()))
        self.assertTrue(torch.equal(loaded.unet.state_dict()[name], weight))

    def test_replacement_network_goes_into_the_pipeline(self):
        """What the trainer does with EMA weights: the pipeline holds the copy it was given."""
        adapter = self.load("sd1x")
        ema = copy.deepcopy(adapter.trainable)
        with torch.no_grad():
            for parameter in ema.parameters():
                parameter.add_(1.0)
        pipeline = adapter.build_pipeline(trainable=ema)
        self.assertIs(pipeline.unet, ema)
        self.assertIs(adapter.build_pipeline().unet, adapter.trainable)


class ValidationImagesTest(PipelineCase):
    def generate(self, adapter, prompts, seed=0):
        return generate_validation_images(adapter.build_pipeline(), prompts, resolution=(64, 32),
                                          num_inference_steps=2, seed=seed)

    def test_fixed_seed_images_are_reproducible_and_independent_of_prompt_order(self):
        adapter = self.load("sdxl")
        images = self.generate(adapter, ["a red circle", "a blue square"])
        self.assertEqual([image.size for image in images], [(64, 32), (64, 32)])
        again = self.generate(adapter, ["a blue square"])
        self.assertTrue(np.array_equal(np.asarray(images[1]), np.asarray(again[0])))
        other_seed = self.generate(adapter, ["a blue square"], seed=1)
        self.assertFalse(np.array_equal(np.asarray(images[1]), np.asarray(other_seed[0])))

    def test_generation_restores_training_mode(self):
        adapter = self.load("sd1x")
        self.assertTrue(adapter.trainable.training)
        self.generate(adapter, ["x"])
        self.assertTrue(adapter.trainable.training)
        self.assertFalse(adapter.vae.training)

    def test_saved_pngs_carry_their_prompts_and_a_grid(self):
        adapter = self.load("sd2x")
        prompts = ["a red circle", "a blue square", "a green star"]
        images = self.generate(adapter, prompts)
        paths = save_validation_images(images, prompts, self.output / "step-10")
        names = sorted(p.name for p in (self.output / "step-10").iterdir())
        self.assertEqual(names, ["grid.png", "image-00.png", "image-01.png", "image-02.png"])
        self.assertEqual(paths[-1].name, "grid.png")
        for path, prompt, image in zip(paths, prompts, images):
            with Image.open(path) as saved:
                self.assertEqual(saved.text["prompt"], prompt)
                self.assertTrue(np.array_equal(np.asarray(saved), np.asarray(image)))
        with Image.open(paths[-1]) as grid:  # three images: two columns, two rows
            self.assertEqual(grid.size, (2 * 64, 2 * 32))

    def test_prompt_count_must_match(self):
        adapter = self.load("sd1x")
        images = self.generate(adapter, ["a"])
        with self.assertRaisesRegex(ValueError, "one prompt per image"):
            save_validation_images(images, ["a", "b"], self.output)


class SizelessPipeline:
    """A pipeline whose call takes no size (as LongCatImageEditPipeline, which edits at about
    1 MP in its reference's shape), returning its output as Kandinsky 5 names it (``image``)."""

    components: dict = {}
    device = torch.device("cpu")

    def set_progress_bar_config(self, **settings):
        pass

    def __call__(self, prompt, image, num_inference_steps, generator, guidance_scale):
        return SimpleNamespace(image=[image.resize((2 * image.width, 2 * image.height))])


class SizelessPipelineTest(unittest.TestCase):
    def test_a_pipeline_that_takes_no_size_gets_its_input_image_at_the_asked_size(self):
        # It sizes its output from its input (HunyuanVideo 1.5 I2V, LongCat-Image-Edit): the
        # input resized to the validation resolution is what makes that resolution's output.
        reference = Image.new("RGB", (24, 16))
        images = generate_validation_images(SizelessPipeline(), ["a"], resolution=(64, 32),
                                            num_inference_steps=1, input_images=[reference])
        self.assertEqual(images[0].size, (128, 64))


if __name__ == "__main__":
    unittest.main()
