"""Wan 2.2 TI2V-5B as image-to-video (a ``video.is_i2v`` dataset): the adapter gives the
transformer what WanImageToVideoPipeline with expand_timesteps gives it (latent frame 0 the
clean latents of the first frame encoded alone, the prepare_latents condition; per-token
timesteps 0 on that frame, t elsewhere, as the pipeline builds them) and leaves that frame out
of the loss; a text-to-video dataset of the same model is unchanged; is_i2v for a model that
trains text-to-video only is refused; a LoRA run on is_i2v clips caches the condition, and the
adapter loads into the image-to-video pipeline and changes the clip it animates from an
image."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline
from PIL import Image
from safetensors.torch import load_file

from model_fixtures import CPU, TinyModelCase
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.base import LossSettings
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model, resolve_model_path
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.preflight import run_preflight
from training_fixtures import TrainingRuns, run_in_process, write_config
from video_fixtures import shapes_frame, write_clip

PROMPTS = ["a square walking", "a bar falling"]
FLAVOUR = "ti2v-5b-2.2"


def image_to_video_pipeline(adapter) -> WanImageToVideoPipeline:
    return WanImageToVideoPipeline(
        tokenizer=adapter.tokenizers[0], text_encoder=adapter.text_encoders[0], vae=adapter.vae,
        scheduler=adapter.scheduler, transformer=adapter.transformer, expand_timesteps=True)


def animate(pipeline) -> np.ndarray:
    """A five-frame 64x64 clip from a fixed image and prompt, [5, 64, 64, 3]."""
    pipeline.set_progress_bar_config(disable=True)
    image = Image.fromarray(shapes_frame(64, 64, 0, seed=1))
    return pipeline(image=image, prompt="a square walking", height=64, width=64, num_frames=5,
                    num_inference_steps=2, output_type="np",
                    generator=torch.Generator().manual_seed(0)).frames[0].astype(np.float64)


class WanTI2VImageToVideoTest(TinyModelCase):
    @classmethod
    def setUpClass(cls):  # one adapter: the tests only run its forward with a zero network
        super().setUpClass()
        cls.adapter = get_adapter_class("wan").load(
            ensure_builtin_model("tiny-wan22-ti2v"), device=CPU, weight_dtype=torch.float32,
            loss_settings=LossSettings(model_flavour=FLAVOUR))

    def setUp(self):
        self.clips = [np.stack([shapes_frame(64, 64, f, seed=s) for f in range(5)])
                      for s in range(2)]

    def batch(self, first_frame_condition: bool) -> TrainingBatch:
        pixels = torch.stack([torch.from_numpy(c).permute(3, 0, 1, 2) for c in self.clips])
        entry = self.adapter.encode_for_cache(pixels.float() / 127.5 - 1, first_frame_condition)
        conditioning = entry if isinstance(entry, dict) else {"latent": entry}
        sizes = [(64, 64)] * len(self.clips)
        return TrainingBatch(conditioning.pop("latent"), self.adapter.encode_prompts(PROMPTS),
                             sizes, [(0, 0)] * len(sizes), sizes, conditioning=conditioning)

    def run_zero_network(self, batch: TrainingBatch) -> tuple[dict, torch.Tensor]:
        seen = {}

        def zero_network(**inputs):  # records its inputs; predicts zero velocity
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        loss = self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=zero_network)
        return seen, loss

    def test_the_network_gets_what_the_image_to_video_pipeline_gives_it(self):
        batch = self.batch(first_frame_condition=True)
        seen, loss = self.run_zero_network(batch)
        self.assertEqual(set(seen), {"hidden_states", "timestep", "encoder_hidden_states",
                                     "return_dict"})
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 48, 2, 4, 4))
        pipeline = image_to_video_pipeline(self.adapter)
        for row, clip in enumerate(self.clips):
            pixels = pipeline.video_processor.preprocess(Image.fromarray(clip[0]), height=64,
                                                         width=64)
            _, condition, mask = pipeline.prepare_latents(
                pixels.float(), 1, 48, 64, 64, 5, torch.float32, CPU,
                torch.Generator().manual_seed(0))
            given = seen["hidden_states"][row:row + 1]
            # the pipeline's own input: (1 - mask) * condition + mask * (its noisy latents)
            torch.testing.assert_close(given, (1 - mask) * condition + mask * given)
            torch.testing.assert_close(given[:, :, 0], condition[:, :, 0], rtol=1e-4, atol=1e-5)
            t = seen["timestep"][row].max()
            self.assertGreater(t.item(), 0)
            self.assertTrue(torch.equal(seen["timestep"][row],
                                        (mask[0][0][:, ::2, ::2] * t).flatten()))
        # frames after the first: noisy latents; the loss is the target's, over those alone
        sigma = (seen["timestep"].amax(dim=1) / 1000).view(-1, 1, 1, 1, 1)
        later = batch.latents[:, :, 1:]
        noise = (seen["hidden_states"][:, :, 1:] - (1 - sigma) * later) / sigma
        self.assertAlmostEqual(loss.item(), (noise - later).pow(2).mean().item(), places=4)
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.25)

    def test_a_text_to_video_dataset_of_the_same_model_is_unchanged(self):
        batch = self.batch(first_frame_condition=False)
        self.assertEqual(batch.conditioning, {})
        seen, loss = self.run_zero_network(batch)
        self.assertEqual(len(set(seen["timestep"][0].tolist())), 1)  # one t on every token
        sigma = (seen["timestep"][:, 0] / 1000).view(-1, 1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * batch.latents) / sigma
        self.assertAlmostEqual(loss.item(), (noise - batch.latents).pow(2).mean().item(),
                               places=4)

    def test_a_one_frame_sample_of_an_image_to_video_dataset_is_refused(self):
        self.clips = [clip[:1] for clip in self.clips]
        with self.assertRaisesRegex(ValueError, "one-frame clip or image leaves nothing"):
            self.run_zero_network(self.batch(first_frame_condition=True))


class IsI2VPreflightTest(unittest.TestCase):
    def problems(self, root: Path, **model) -> list[str]:
        (root / "clips").mkdir(exist_ok=True)
        datasets = [{"id": "clips", "dataset_type": "video",
                     "instance_data_dir": str(root / "clips"),
                     "video": {"bucket_strategy": "resolution_frames", "is_i2v": True}}]
        config = write_config(root, root, "check", datasets, **{**TI2V, **model})
        try:
            run_preflight(load_configuration(config, cwd=root))
        except ConfigError as error:
            return error.problems
        return []

    def test_is_i2v_is_refused_for_a_model_that_trains_text_to_video_only(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(self.problems(Path(tmp)), [])
            problems = self.problems(Path(tmp), model_flavour=None,
                                     pretrained_model_name_or_path="builtin:tiny-wan")
        self.assertEqual(len(problems), 1, problems)
        self.assertRegex(problems[0], "check-multidatabackend.json: dataset 'clips': key "
                                      "'video': 'is_i2v' is true, but .* trains text-to-video "
                                      "only; use an image-to-video model .*or remove is_i2v")


TI2V = dict(model_family="wan", pretrained_model_name_or_path="builtin:tiny-wan22-ti2v",
            model_flavour=FLAVOUR, resolution=64, train_batch_size=1, max_train_steps=4,
            model_type="lora", lora_rank=4, learning_rate=3e-2)


class WanTI2VImageToVideoTrainingTest(TrainingRuns, unittest.TestCase):
    """A LoRA run of 4 steps on two is_i2v clips (two epochs), in this process."""

    tmp_prefix, options = "st-ti2v-i2v-", TI2V
    launch = staticmethod(run_in_process)

    @classmethod
    def start_runs(cls):
        for i in range(2):
            write_clip(cls.root / "clips" / f"walk{i}.mp4", 64, 64, 9, seed=i,
                       caption=f"a square walking, take {i}")
        cls.datasets = [{"id": "clips", "dataset_type": "video",
                         "instance_data_dir": str(cls.root / "clips"),
                         "video": {"bucket_strategy": "resolution_frames", "is_i2v": True}}]
        cls.train("lora")

    def test_each_clip_is_cached_with_its_first_frame_latents(self):
        entries = [load_file(p) for p in
                   (self.root / "lora-out" / "cache" / "vae" / "clips").rglob("*.safetensors")]
        self.assertEqual(len(entries), 2)
        for entry in entries:  # 9 frames -> 3 latent frames of 4x4; the condition: one
            self.assertEqual(tuple(entry["latent"].shape), (48, 3, 4, 4))
            self.assertEqual(tuple(entry["first_frame_latents"].shape), (48, 1, 4, 4))
            # a causal VAE: latent frame 0 of the clip sees pixel frame 0 alone
            torch.testing.assert_close(entry["first_frame_latents"][:, 0], entry["latent"][:, 0],
                                       rtol=1e-4, atol=1e-4)

    def test_the_lora_loads_into_the_image_to_video_pipeline_and_changes_its_clip(self):
        pipeline = WanImageToVideoPipeline.from_pretrained(
            resolve_model_path("builtin:tiny-wan22-ti2v"))
        self.assertTrue(pipeline.config.expand_timesteps)
        before = animate(pipeline)
        self.assertEqual(before.shape, (5, 64, 64, 3))
        pipeline.load_lora_weights(self.root / "lora-out" / "lora")
        self.assertGreater(np.abs(animate(pipeline) - before).mean(), 1e-3)


if __name__ == "__main__":
    unittest.main()
