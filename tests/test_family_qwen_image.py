"""Qwen-Image (model_family qwen_image): the adapter learns, trains on what QwenImagePipeline
would give its transformer, keeps a padded batch's prediction unchanged; plan --memory sizes
the published 20B transformer; its config mistakes are named. Training, resume and export: the
conformance suite (tests/conformance.py)."""

from __future__ import annotations

import io
import json
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

import torch
from diffusers import DiffusionPipeline, QwenImagePipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.cli import main
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.caching.text_embeds import TextEmbedCache, cache_text_embeds
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.flow_objective import shift_sigmas
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.memory.sharding import repeated_blocks
from training_fixtures import make_shapes, write_config

# Qwen/Qwen-Image's published configs (transformer/, vae/, text_encoder/config.json on the Hub),
# the values that size the tensors.
QWEN_IMAGE_CONFIGS = {
    "transformer": {"_class_name": "QwenImageTransformer2DModel", "patch_size": 2,
                    "in_channels": 64, "out_channels": 16, "num_layers": 60,
                    "attention_head_dim": 128, "num_attention_heads": 24,
                    "joint_attention_dim": 3584, "guidance_embeds": False,
                    "axes_dims_rope": [16, 56, 56]},
    "vae": {"_class_name": "AutoencoderKLQwenImage", "base_dim": 96, "z_dim": 16,
            "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
            "temperal_downsample": [False, True, True]},
    "text_encoder": {  # Qwen2.5-VL-7B-Instruct, saved flat as transformers 4 wrote it
        "model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "vocab_size": 152064, "tie_word_embeddings": False,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                          "num_heads": 16, "out_hidden_size": 3584, "patch_size": 14,
                          "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "fullatt_block_indexes": [7, 15, 23, 31], "window_size": 112}},
}
# "Qwen-Image, a 20B MMDiT image foundation model": the Qwen-Image model card on the Hub and
# its technical report (arXiv 2508.02324). 20.43 B counted from the configs above.
QWEN_IMAGE_PARAMETERS = 20e9


class QwenCase(TinyModelCase):
    def load(self, **loss):
        return super().load("qwen_image", **loss)


class QwenAdapterTest(QwenCase):
    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        torch.manual_seed(0)
        adapter = self.load()
        before, after = losses_around_training(adapter, random_batch(adapter, 4), lr=3e-3,
                                               steps=20)
        self.assertLess(after, 0.75 * before, f"{before} -> {after}")

    def test_the_network_gets_what_the_pipeline_would_give_it(self):
        adapter = self.load()
        pipeline = DiffusionPipeline.from_pretrained(ensure_builtin_model("tiny-qwen_image"))
        prompts = ["a red circle", "a much longer prompt: a small blue square on green"]
        pixels = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(1)) * 2 - 1
        batch = TrainingBatch(latents=adapter.encode_images(pixels),
                              prompt_embeds=adapter.encode_prompts(prompts),
                              original_sizes=[(64, 96)] * 2, crop_top_lefts=[(0, 0)] * 2,
                              target_sizes=[(64, 96)] * 2)
        # Latents: the VAE's mode of the one-frame video, (z - mean) / std as the pipelines do.
        with torch.no_grad():
            z = pipeline.vae.encode(pixels.unsqueeze(2)).latent_dist.mode()
        config = pipeline.vae.config
        mean = torch.tensor(config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(config.latents_std).view(1, 16, 1, 1, 1)
        self.assertTrue(torch.allclose(batch.latents, ((z - mean) / std)[:, :, 0], atol=1e-6))
        # Text: the pipeline's encode_prompt, its mask included (one prompt is padded).
        embeds, mask = pipeline.encode_prompt(prompts, device=CPU)
        loss, seen = self.capture_network_inputs(adapter, batch)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["encoder_hidden_states_mask"], mask))
        self.assertLess(int(mask[0].sum()), mask.shape[1])
        # Image: packed 2x2 with the pipeline's helper, its img_shapes, the timestep as sigma.
        packed = QwenImagePipeline._pack_latents(batch.latents, 2, 16, 8, 12)
        self.assertEqual(seen["img_shapes"], [[(1, 64 // 8 // 2, 96 // 8 // 2)]] * 2)
        sigma = seen["timestep"].view(-1, 1, 1)
        self.assertTrue(bool(((sigma > 0) & (sigma < 1)).all()))
        noise = (seen["hidden_states"] - (1 - sigma) * packed) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)  # it really is the noise
        self.assertAlmostEqual(loss.item(), (noise - packed).pow(2).mean().item(), places=4)

    def test_default_shift_is_the_pipelines_mu_through_the_schedulers_time_shift(self):
        adapter = self.load()
        config = adapter.scheduler.config
        tokens = (64 // 2) * (64 // 2)  # a 64 x 64 latent (512 px)
        mu = calculate_shift(tokens, config.base_image_seq_len, config.max_image_seq_len,
                             config.base_shift, config.max_shift)
        sigmas = torch.linspace(0.05, 0.95, 7)
        self.assertTrue(torch.allclose(shift_sigmas(sigmas, adapter.sigma_shift(64, 64)),
                                       adapter.scheduler.time_shift(mu, 1.0, sigmas),
                                       atol=1e-6))
        self.assertEqual(self.load(flow_shift=1.73).shift_for(torch.zeros(1, 16, 64, 64)), 1.73)

    def test_cached_rows_of_different_lengths_predict_as_the_unpadded_batch(self):
        """Captions cached one by one have their own lengths; stacked, the shorter is padded
        and masked, and each sample's loss equals its loss alone."""
        adapter = self.load()
        prompts = ["a red circle", "a much longer caption about a blue square on green"]
        cache = TextEmbedCache(Path(self.enterContext(tempfile.TemporaryDirectory())), "tiny")
        cache_text_embeds(prompts, cache, adapter.encode_prompts, batch_size=1, progress=False)
        stacked = cache.load(prompts)
        alone = [adapter.encode_prompts([prompt]) for prompt in prompts]
        self.assertEqual(stacked["prompt_embeds"].shape[1], alone[1]["prompt_embeds"].shape[1])
        self.assertLess(alone[0]["prompt_embeds"].shape[1], stacked["prompt_embeds"].shape[1])
        latents = random_batch(adapter, 2).latents
        losses = []
        for index, embeds in enumerate(alone):
            losses.append(self.per_sample_loss(adapter, latents[index:index + 1], embeds))
        together = self.per_sample_loss(adapter, latents, stacked)
        self.assertTrue(torch.allclose(together, torch.cat(losses), atol=1e-5))

    @staticmethod
    def per_sample_loss(adapter, latents, embeds) -> torch.Tensor:
        noisy = latents + 0.5
        sigmas = torch.full((latents.shape[0],), 0.5)
        batch = TrainingBatch(latents=latents, prompt_embeds=embeds, original_sizes=[],
                              crop_top_lefts=[], target_sizes=[])
        with torch.no_grad():
            prediction = adapter._predict(adapter.transformer, noisy, sigmas, batch,
                                          torch.float32)
        return prediction.pow(2).mean(dim=(1, 2, 3))

    def test_validation_uses_true_cfg_with_a_negative_prompt(self):
        adapter = self.load()
        self.assertEqual(adapter.validation_arguments({"guidance_scale": 4.0}),
                         {"true_cfg_scale": 4.0, "negative_prompt": " ", "guidance_scale": None})
        self.assertEqual(adapter.validation_arguments({"guidance_scale": 1.0}),
                         {"true_cfg_scale": 1.0, "guidance_scale": None})
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        calls = []
        hook = pipeline.transformer.register_forward_hook(lambda *_: calls.append(1))
        self.addCleanup(hook.remove)
        for scale in (1.0, 4.0):
            calls.clear()
            pipeline(prompt="a red circle", height=64, width=64, num_inference_steps=2,
                     generator=torch.Generator().manual_seed(0),
                     **adapter.validation_arguments({"guidance_scale": scale}))
            # With guidance each step also predicts for the negative prompt.
            self.assertEqual(len(calls), 4 if scale > 1 else 2)

    def test_fsdp_finds_the_transformer_blocks(self):
        blocks = repeated_blocks(self.load().transformer)
        names = [type(block).__name__ for block in blocks]
        self.assertEqual(names.count("QwenImageTransformerBlock"), 2)

    def test_folders_of_other_families_are_told_apart(self):
        qwen = get_adapter_class("qwen_image")
        with self.assertRaises(ModelFolderError) as caught:
            qwen.load(ensure_builtin_model("tiny-flux"), device=CPU, weight_dtype=torch.float32,
                      loss_settings=LossSettings())
        self.assertIn("has text_encoder_2/", str(caught.exception))
        self.assertIn("says it is flux", str(caught.exception))
        with self.assertRaises(ModelFolderError) as caught:
            get_adapter_class("flux").load(ensure_builtin_model("tiny-qwen_image"), device=CPU,
                                           weight_dtype=torch.float32,
                                           loss_settings=LossSettings())
        self.assertIn("says it is qwen_image", str(caught.exception))


class QwenMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_transformer(self):
        tmp = self.enterContext(tempfile.TemporaryDirectory(prefix="st-qwen-plan-"))
        root = Path(tmp)
        for subfolder, config in QWEN_IMAGE_CONFIGS.items():
            (root / "qwen-image" / subfolder).mkdir(parents=True)
            (root / "qwen-image" / subfolder / "config.json").write_text(json.dumps(config))
        make_shapes(root / "data", per_size=1, sizes=((64, 64),))
        config = write_config(root, root / "data", model_family="qwen_image",
                              pretrained_model_name_or_path=str(root / "qwen-image"),
                              mixed_precision="bf16")
        printed = io.StringIO()
        with redirect_stdout(printed):  # the CLI's main in-process: no interpreter start-up
            status = main(["plan", "--memory", "--config", str(config), "--num-processes", "8"])
        self.assertEqual(status, 0)
        counted = float(printed.getvalue().split(" B parameters")[0].split()[-1]) * 1e9
        self.assertAlmostEqual(counted / QWEN_IMAGE_PARAMETERS, 1, delta=0.03)
        self.assertIn("20.43 B parameters", printed.getvalue())
        # The frozen parts in bf16: Qwen2.5-VL-7B-Instruct (8.29 B parameters on its model card)
        # and the VAE (0.13 B, as Wan 2.1's, which it extends).
        frozen = next(line for line in printed.getvalue().splitlines()
                      if line.strip().startswith("VAE + text encoders"))
        gib = float(frozen.split("encoders")[1].split("GiB")[0])
        self.assertAlmostEqual(gib * 2**30 / ((8.29e9 + 0.127e9) * 2), 1, delta=0.02)


class QwenConfigTest(unittest.TestCase):
    def problems(self, **options) -> list[str]:
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        (root / "images").mkdir()
        (root / "backend.json").write_text(json.dumps([{"id": "a",
                                                        "instance_data_dir": "images"}]))
        (root / "config.json").write_text(json.dumps({
            "model_family": "qwen_image", "output_dir": "out",
            "pretrained_model_name_or_path": "builtin:tiny-qwen_image",
            "data_backend_config": str(root / "backend.json"), **options}))
        with self.assertRaises(ConfigError) as caught:
            load_configuration(root / "config.json", cwd=root)
        return caught.exception.problems

    def test_guidance_options_qwen_image_has_not_are_named(self):
        (problem,) = self.problems(validation_guidance_rescale=0.7)
        self.assertIn("the qwen_image pipeline has no guidance rescale", problem)
        (problem,) = self.problems(validation_guidance_real=4.0)
        self.assertIn("validation_guidance_real", problem)
        self.assertIn("Qwen-Image and Chroma: their true classifier-free guidance", problem)
        (problem,) = self.problems(flux_guidance_value=3.5)
        self.assertIn("applies to model_families 'flux' and 'flux2' only", problem)


if __name__ == "__main__":
    unittest.main()
