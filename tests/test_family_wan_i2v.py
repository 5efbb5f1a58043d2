"""Wan 2.1 image-to-video: the adapter gives the transformer what WanImageToVideoPipeline gives
it (the noisy latents, the first-frame mask and condition latents of its prepare_latents, the
CLIP embedding of its encode_image), cached per clip; model_flavour must name the folder's
kind; a LoRA run of builtin:tiny-wan-i2v on clips caches each clip's conditioning and
validates by animating the first frames of training clips (validation_using_datasets), which
only image-to-video models need and take. Training, resume and export: the conformance suite
(tests/conformance.py)."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline
from PIL import Image
from safetensors.torch import load_file

from model_fixtures import CPU, TinyModelCase
from simpletuner.configuration import load_configuration
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.reporting.validation_inputs import (validation_input_images,
                                                              validation_input_problems)
from simpletuner.training.settings import ValidationSettings
from training_fixtures import TrainingRuns, run_in_process, write_config
from video_fixtures import shapes_frame, write_clip

PROMPTS = ["a red circle", "  a blue   square on a long &amp; green background "]


def animate(pipeline) -> np.ndarray:
    """A five-frame 64x48 clip from a fixed image and prompt, [5, 48, 64, 3]."""
    pipeline.set_progress_bar_config(disable=True)
    image = Image.fromarray(shapes_frame(64, 48, 0, seed=1))
    return pipeline(image=image, prompt="a square walking", height=48, width=64, num_frames=5,
                    num_inference_steps=2, output_type="np",
                    generator=torch.Generator().manual_seed(0)).frames[0].astype(np.float64)


class WanI2VAdapterTest(TinyModelCase):
    def load_i2v(self):
        return get_adapter_class("wan").load(
            ensure_builtin_model("tiny-wan-i2v"), device=CPU, weight_dtype=torch.float32,
            loss_settings=LossSettings())

    @staticmethod
    def clips(count: int, frames: int, height: int, width: int) -> list[np.ndarray]:
        return [np.stack([shapes_frame(width, height, f, seed=s) for f in range(frames)])
                for s in range(count)]

    def cached_batch(self, adapter, clips: list[np.ndarray]) -> TrainingBatch:
        """What the latent cache keeps of each clip, [-1, 1] pixels as clip.py gives them."""
        pixels = torch.stack([torch.from_numpy(c).permute(3, 0, 1, 2) for c in clips])
        entry = adapter.encode_for_cache(pixels.float() / 127.5 - 1)
        height, width = clips[0].shape[1:3]
        return TrainingBatch(entry.pop("latent"), adapter.encode_prompts(PROMPTS[:len(clips)]),
                             [(height, width)] * len(clips), [(0, 0)] * len(clips),
                             [(height, width)] * len(clips), conditioning=entry)

    def test_the_network_gets_what_wan_image_to_video_pipeline_gives_it(self):
        adapter = self.load_i2v()
        clips = self.clips(2, 5, 32, 48)
        batch = self.cached_batch(adapter, clips)
        seen = {}

        def zero_network(**inputs):  # records its inputs; predicts zero velocity
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"][:, :16]),)

        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(5),
                                    network=zero_network)
        self.assertEqual(set(seen), {"hidden_states", "timestep", "encoder_hidden_states",
                                     "encoder_hidden_states_image", "return_dict"})
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 36, 2, 4, 6))
        pipeline = adapter.build_pipeline()
        self.assertIsInstance(pipeline, WanImageToVideoPipeline)
        embeds, _ = pipeline.encode_prompt(PROMPTS, do_classifier_free_guidance=False,
                                           max_sequence_length=512, device=CPU)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        for row, clip in enumerate(clips):
            image = Image.fromarray(clip[0])  # the clip's first frame, given as the pipeline's
            pixels = pipeline.video_processor.preprocess(image, height=32, width=48)
            _, condition = pipeline.prepare_latents(
                pixels.float(), 1, 16, 32, 48, 5, torch.float32, CPU,
                torch.Generator().manual_seed(0))
            torch.testing.assert_close(seen["hidden_states"][row, 16:], condition[0],
                                       rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(seen["encoder_hidden_states_image"][row],
                                       pipeline.encode_image(image, CPU)[0],
                                       rtol=1e-4, atol=1e-6)
        # The first 16 channels are the noisy latents; the target is noise - latents.
        sigma = (seen["timestep"] / 1000).view(-1, 1, 1, 1, 1)
        noise = (seen["hidden_states"][:, :16] - (1 - sigma) * batch.latents) / sigma
        self.assertAlmostEqual(loss.item(), (noise - batch.latents).pow(2).mean().item(),
                               places=4)
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.2)

    def test_the_image_embedding_and_condition_latents_get_gradients(self):
        adapter = self.load_i2v()
        batch = self.cached_batch(adapter, self.clips(1, 5, 32, 32))
        adapter.compute_loss(batch, torch.Generator().manual_seed(2)).backward()
        transformer = adapter.transformer
        image_path = transformer.condition_embedder.image_embedder.ff.net[0].proj.weight.grad
        self.assertGreater(image_path.abs().sum().item(), 0)
        condition_inputs = transformer.patch_embedding.weight.grad[:, 16:]  # mask + condition
        self.assertGreater(condition_inputs.abs().sum().item(), 0)

    def test_block_swap_placement_moves_the_image_encoder_and_leaves_the_host_block(self):
        adapter = self.load_i2v()
        self.assert_block_swap_moves(adapter, adapter.image_encoder)

    def test_model_flavour_must_name_the_folders_kind(self):
        i2v, t2v = ensure_builtin_model("tiny-wan-i2v"), ensure_builtin_model("tiny-wan")
        wan = get_adapter_class("wan")
        self.assertIsNone(wan.flavour_problem(i2v, "i2v-480p-14b-2.1"))
        self.assertIsNone(wan.flavour_problem(t2v, "t2v-480p-1.3b-2.1"))
        self.assertRegex(wan.flavour_problem(i2v, "t2v-480p-14b-2.1"),
                         "is a Wan 2.1 text-to-video model .*, but .* is a Wan 2.1 "
                         "image-to-video model \\(WanImageToVideoPipeline\\)")
        self.assertRegex(wan.flavour_problem(t2v, "i2v-720p-14b-2.1"),
                         "is a Wan 2.1 image-to-video model.* is a Wan 2.1 text-to-video "
                         "model \\(WanPipeline")
        self.assertRegex(wan.flavour_problem(t2v, "i2v-14b-2.2-high"),
                         "not a supported Wan flavour; use one of .*i2v-480p-14b-2.1")

    def test_validation_needs_input_images_exactly_for_image_to_video_models(self):
        wan = get_adapter_class("wan")
        i2v = wan.for_folder(ensure_builtin_model("tiny-wan-i2v"))
        t2v = wan.for_folder(ensure_builtin_model("tiny-wan"))
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "data").mkdir()

            def training(**options):
                config = write_config(root, root / "data", model_family="wan", **options)
                return load_configuration(config, cwd=root).training

            prompted = training(validation_prompt="a red circle")
            self.assertRegex(" ".join(validation_input_problems(i2v, prompted, "c.json")),
                             "c.json: key 'validation_prompt': .*set validation_using_datasets "
                             "true .*or validation_disable true")
            self.assertEqual(validation_input_problems(t2v, prompted, "c.json"), [])
            using = training(validation_prompt="a red circle", validation_using_datasets=True)
            self.assertEqual(validation_input_problems(i2v, using, "c.json"), [])
            self.assertRegex(" ".join(validation_input_problems(t2v, using, "c.json")),
                             "key 'validation_using_datasets': only image-to-video models")
            self.assertEqual(validation_input_problems(
                i2v, training(validation_prompt="x", validation_disable=True), "c.json"), [])

    def test_an_image_to_video_folder_without_its_image_encoder_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "wan"
            shutil.copytree(ensure_builtin_model("tiny-wan-i2v"), folder)
            shutil.rmtree(folder / "image_encoder")  # as Wan 2.2's I2V folders are
            with self.assertRaisesRegex(ModelFolderError, "without image_encoder/"):
                get_adapter_class("wan").check_folder(folder)


WAN_I2V = dict(model_family="wan", pretrained_model_name_or_path="builtin:tiny-wan-i2v",
               model_flavour="i2v-480p-14b-2.1", resolution=48, train_batch_size=1,
               max_train_steps=2, model_type="lora", lora_rank=4, learning_rate=3e-2,
               validation_prompt=["a square walking", "a bar falling"],
               validation_using_datasets=True, validation_num_inference_steps=2,
               validation_resolution="64x48", validation_num_video_frames=5)


class WanI2VTrainingTest(TrainingRuns, unittest.TestCase):
    """On four clips, a LoRA run of 2 steps in this process, validated at the end."""

    tmp_prefix, options = "st-wan-i2v-", WAN_I2V
    launch = staticmethod(run_in_process)

    @classmethod
    def start_runs(cls):
        for i in range(4):
            write_clip(cls.root / "clips" / f"walk{i}.mp4", 64, 48, 9, seed=i,
                       caption=f"a square walking, take {i}")
        cls.datasets = [{"id": "clips", "dataset_type": "video",
                         "instance_data_dir": str(cls.root / "clips"),
                         "video": {"bucket_strategy": "resolution_frames"}}]
        cls.train("lora")

    def test_each_clip_is_cached_with_its_first_frame_conditioning(self):
        entries = [load_file(p) for p in
                   (self.root / "lora-out" / "cache" / "vae" / "clips").rglob("*.safetensors")]
        self.assertEqual(len(entries), 4)
        for entry in entries:  # 9 frames -> 3 latent frames of 8x6; 16 patches + CLS of CLIP
            self.assertEqual(tuple(entry["latent"].shape), (16, 3, 6, 8))
            self.assertEqual(tuple(entry["image_latents"].shape), (16, 3, 6, 8))
            self.assertEqual(tuple(entry["image_embeds"].shape), (17, 8))
            # A causal VAE: latent frame 0 sees pixel frame 0 alone, the first frame both have.
            torch.testing.assert_close(entry["image_latents"][:, 0], entry["latent"][:, 0],
                                       rtol=1e-4, atol=1e-4)
            self.assertFalse(torch.allclose(entry["image_latents"][:, 1:],
                                            entry["latent"][:, 1:], atol=1e-3))

    def test_validation_animates_a_training_clips_first_frame_per_prompt(self):
        folder = self.root / "lora-out" / "validation" / "step-2"
        for index in (0, 1):
            with Image.open(folder / f"clip-{index:02d}.webp") as clip:
                self.assertEqual((clip.size, clip.n_frames), ((64, 48), 5))
        configuration = load_configuration(self.root / "lora.json", cwd=self.root)
        names = [f"walk{i}.mp4" for i in (2, 0, 1)]
        index = DatasetIndex("clips", {"64x48@9": names}, {n: (64, 48) for n in names},
                             clips={n: ClipPlan(9, "16/1", 9, "container") for n in names})
        settings = ValidationSettings.from_config(configuration.training)
        images = validation_input_images(configuration.datasets, {"clips": index}, settings)
        expected = [shapes_frame(64, 48, 0, seed=i) for i in (0, 1)]  # sorted: walk0, walk1
        self.assertEqual(len(images), 2)
        for image, frame in zip(images, expected):  # as decoded: H.264 is lossy
            self.assertLess(np.abs(np.asarray(image, np.float64) - frame).mean(), 8)
        self.assertGreater(np.abs(np.asarray(images[0], np.float64)
                                  - np.asarray(images[1], np.float64)).mean(), 8)


if __name__ == "__main__":
    unittest.main()
