"""Wan 2.1 text-to-video, trained on images as one-frame clips: the adapter learns and gives the
transformer what WanPipeline gives it ([B, C, F, h, w] latents, timestep sigma * 1000, the
pipeline's zero-padded UMT5 embeddings); Wan 2.2 flavours are refused by name; a run validates
with a clip the report shows as an animation Chromium decodes; plan --memory counts the
published parameters of Wan2.1-T2V-1.3B and -14B. Training, resume and export: the conformance
suite (tests/conformance.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from PIL import Image

from headless_browser import chromium
from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.flow_objective import shift_sigmas
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.memory.sharding import repeated_blocks
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import (ReportView, TrainingRuns, check_recording_torch, make_shapes,
                               run_in_process, write_config)

# A page that tells what headless Chromium decoded of an image: its size, or the error.
DECODED_PROBE = ('<img id="clip" src="{src}"><pre id="decoded"></pre><script>'
                 'const img = document.getElementById("clip"), out = document.getElementById('
                 '"decoded"); function show() {{ out.textContent = img.naturalWidth + "x" + '
                 'img.naturalHeight; }} if (img.complete) show(); else {{ img.onload = show; '
                 'img.onerror = () => out.textContent = "error"; }}</script>')

# Parameters of the published transformers, from their checkpoints' sizes: Comfy-Org's
# wan2.1_t2v_1.3B_fp16.safetensors is 2.84 GB and wan2.1_t2v_14B_fp16.safetensors 28.6 GB, two
# bytes a parameter (huggingface.co/Comfy-Org/Wan_2.1_ComfyUI_repackaged); the model names'
# "1.3B" and "14B" (huggingface.co/Wan-AI/Wan2.1-T2V-1.3B, -14B) are these, rounded.
WAN_PARAMETERS = {"1.3b": 1.42e9, "14b": 14.3e9}
WAN21_T2V_CONFIGS = {  # Wan-AI/Wan2.1-T2V-*-Diffusers' configs, what sizes the tensors
    "1.3b": {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30},
    "14b": {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40},
}
SHARED_CONFIGS = {
    "vae": {"_class_name": "AutoencoderKLWan", "base_dim": 96, "z_dim": 16,
            "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "temperal_downsample": [False, True, True]},
    "text_encoder": {"model_type": "umt5", "d_model": 4096, "d_ff": 10240, "d_kv": 64,
                     "num_heads": 64, "num_layers": 24, "vocab_size": 256384,
                     "feed_forward_proj": "gated-gelu"},
}


def transformer_config(size: str) -> dict:
    return {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2],
            "attention_head_dim": 128, "in_channels": 16, "out_channels": 16,
            "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True,
            "qk_norm": "rms_norm_across_heads", **WAN21_T2V_CONFIGS[size]}


class WanAdapterTest(TinyModelCase):
    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        torch.manual_seed(0)
        adapter = self.load("wan")
        before, after = losses_around_training(adapter, random_batch(adapter, 2), lr=5e-3,
                                               steps=25)
        self.assertLess(after, 0.75 * before, f"{before} -> {after}")

    def test_the_network_gets_what_wan_pipeline_gives_it(self):
        adapter = self.load("wan")
        prompts = ["a red circle", "  a blue   square on a long &amp; green background "]
        batch = random_batch(adapter, 2, height=64, width=128, prompts=prompts)
        self.assertEqual(tuple(batch.latents.shape), (2, 16, 1, 8, 16))  # one-frame clips
        loss, seen = self.capture_network_inputs(adapter, batch)
        self.assertEqual(set(seen), {"hidden_states", "timestep", "encoder_hidden_states",
                                     "return_dict"})
        pipeline = adapter.build_pipeline()
        embeds, _ = pipeline.encode_prompt(prompts, do_classifier_free_guidance=False,
                                           max_sequence_length=512, device=CPU)
        self.assertEqual(tuple(embeds.shape), (2, 512, 32))
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        length = len(pipeline.tokenizer(prompts[0]).input_ids)  # zeros past its tokens only
        self.assertTrue(bool((embeds[0, length:] == 0).all()))
        self.assertTrue(bool((embeds[0, :length] != 0).any(dim=-1).all()))
        # The pipeline decodes latents * std + mean: the cached latents invert that.
        config = adapter.vae.config
        mean = torch.tensor(config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(config.latents_std).view(1, 16, 1, 1, 1)
        pixels = torch.rand(2, 3, 1, 64, 128, generator=torch.Generator().manual_seed(7))
        raw = adapter.vae.encode(pixels * 2 - 1).latent_dist.mode()
        torch.testing.assert_close(batch.latents * std + mean, raw, rtol=1e-4, atol=1e-5)
        # The timestep is sigma * 1000 (UniPC's flow timesteps); the target is noise - latents.
        timesteps = seen["timestep"]
        self.assertTrue(bool(((timesteps > 0) & (timesteps < 1000)).all()))
        sigma = (timesteps / 1000).view(-1, 1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * batch.latents) / sigma
        self.assertAlmostEqual(loss.item(), (noise - batch.latents).pow(2).mean().item(),
                               places=4)
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)

    def test_training_noise_levels_are_shifted_as_the_pipelines_schedule(self):
        adapter = self.load("wan")
        scheduler = adapter.build_pipeline().scheduler
        scheduler.set_timesteps(10)
        levels = torch.linspace(1, 1 / 1000, 11, dtype=torch.float64)[:-1]
        shifted = shift_sigmas(levels, adapter.sigma_shift(8, 8))
        # The same shift; the pipeline nudges its first sigma 1e-6 below 1, and passes the
        # timestep as int(sigma * 1000) (UniPC's int64 timesteps; training passes it unrounded).
        sigmas = torch.as_tensor(scheduler.sigmas[:-1], dtype=torch.float64)
        torch.testing.assert_close(sigmas, shifted, rtol=0, atol=2e-6)
        self.assertTrue(torch.equal(scheduler.timesteps, (sigmas * 1000).long()))
        self.assertEqual(self.load("wan", flow_shift=5.0).shift_for(torch.zeros(1, 16, 2, 8, 8)),
                         5.0)

    def test_clips_of_several_latent_frames_train_too(self):
        adapter = self.load("wan")
        clip = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
        latents = adapter.encode_images(clip)
        self.assertEqual(tuple(latents.shape), (1, 16, 2, 4, 4))  # 1 + 4 frames -> 2
        batch = TrainingBatch(latents, adapter.encode_prompts(["a red circle"]), [(32, 32)],
                              [(0, 0)], [(32, 32)])
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(2))
        loss.backward()
        self.assertTrue(torch.isfinite(loss))
        self.assertGreater(adapter.transformer.proj_out.weight.grad.abs().sum().item(), 0)

    def test_gradient_checkpointing_keeps_the_loss_and_its_gradients(self):
        adapter = self.load("wan")
        batch = random_batch(adapter, 2)

        def loss_and_gradients():
            adapter.transformer.zero_grad()
            loss = adapter.compute_loss(batch, torch.Generator().manual_seed(3))
            loss.backward()
            return loss.item(), [p.grad.clone() for p in adapter.transformer.parameters()]

        plain_loss, plain = loss_and_gradients()
        adapter.set_gradient_checkpointing(True)
        self.assertTrue(adapter.transformer.gradient_checkpointing)
        checkpointed_loss, checkpointed = loss_and_gradients()
        self.assertEqual(checkpointed_loss, plain_loss)
        for first, second in zip(plain, checkpointed):
            torch.testing.assert_close(second, first, rtol=1e-5, atol=1e-7)

    def test_fsdp_shards_each_wan_transformer_block(self):
        transformer = self.load("wan").transformer
        blocks = repeated_blocks(transformer)
        self.assertEqual([b for b in blocks if type(b).__name__ == "WanTransformerBlock"],
                         list(transformer.blocks))
        # Besides them only the condition embedder, a top-level child defined beside them.
        self.assertEqual([b for b in blocks if type(b).__name__ != "WanTransformerBlock"],
                         [transformer.condition_embedder])

    def test_vace_and_a_second_expert_without_a_boundary_are_refused_by_name(self):
        tiny = ensure_builtin_model("tiny-wan")
        for change, named in ((lambda d: (d / "transformer_2").mkdir(), "transformer_2/"),
                              (lambda d: self.rename_pipeline(d, "WanVACEPipeline"),
                               "WanVACEPipeline")):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp) / "wan"
                shutil.copytree(tiny, folder)
                change(folder)
                with self.assertRaisesRegex(ModelFolderError, f"{named}.*supported here: Wan "
                                            "2.1 text-to-video.*t2v-480p-1.3b-2.1.*"
                                            "i2v-480p-14b-2.1"):
                    get_adapter_class("wan").load(folder, device=CPU, weight_dtype=torch.float32,
                                                  loss_settings=LossSettings())

    @staticmethod
    def rename_pipeline(folder: Path, name: str) -> None:
        index = json.loads((folder / "model_index.json").read_text())
        (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": name}))


class WanConfigTest(unittest.TestCase):
    def load(self, **options):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="wan",
                                  pretrained_model_name_or_path="builtin:tiny-wan", **options)
            return load_configuration(config, cwd=root)

    def problems(self, **options) -> str:
        with self.assertRaises(ConfigError) as caught:
            self.load(**options)
        return str(caught.exception)

    def test_check_refuses_a_wan_2_2_i2v_folder_before_launch_without_torch(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            folder = root / "wan-i2v"
            (folder / "image_encoder").mkdir(parents=True)
            (folder / "model_index.json").write_text(
                json.dumps({"_class_name": "WanImageToVideoPipeline", "boundary_ratio": 0.9}))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="wan",
                                  pretrained_model_name_or_path=str(folder))
            result = check_recording_torch(config, root)
        # check stayed torch-free and exited 2, a configuration problem
        self.assertEqual(result.stdout.split()[-2:], ["False", "2"], result.stderr[-2000:])
        self.assertRegex(result.stdout + result.stderr, "names WanImageToVideoPipeline with "
                         "Wan 2.2's .*; supported here: Wan 2.1 text-to-video")

    def test_wan_options_are_accepted_or_refused_with_advice(self):
        self.load(wan_force_2_1_time_embedding=True, wan_validation_load_other_stage=True)
        self.assertIn("validation_guidance_rescale",
                      self.problems(validation_guidance_rescale=0.7))


class WanValidationClipTest(TrainingRuns, unittest.TestCase):
    """A full run of 2 steps in this process, validated at the end with a five-frame clip."""

    tmp_prefix = "st-wan-"
    launch = staticmethod(run_in_process)
    options = dict(model_family="wan", pretrained_model_name_or_path="builtin:tiny-wan",
                   max_train_steps=2, validation_prompt="a red circle",
                   validation_num_inference_steps=2, validation_resolution="96x64",
                   validation_num_video_frames=5)

    @classmethod
    def start_runs(cls):
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.train("full")

    def test_the_validation_clip_is_an_animation_of_its_frames(self):
        with Image.open(self.root / "full-out" / "validation" / "step-2" / "clip-00.webp") as clip:
            self.assertEqual((clip.size, clip.n_frames), ((96, 64), 5))
            self.assertTrue(clip.is_animated)

    def test_the_report_shows_the_validation_clip_as_an_animation_chromium_decodes(self):
        out = self.root / "full-out"
        clip = "validation/step-2/clip-00.webp"
        dom = ReportView(chromium(self.tmp, "--dump-dom",
                                  (out / "training_report.html").as_uri()))
        self.assertIn(clip, dom.images)
        probe = out / "decoded-probe.html"
        probe.write_text(DECODED_PROBE.format(src=clip))
        decoded = chromium(self.tmp, "--allow-file-access-from-files",
                           "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
        self.assertIn('<pre id="decoded">96x64</pre>', decoded)


class WanMemoryPlanTest(unittest.TestCase):
    def plan(self, tmp: str, size: str) -> str:
        root = Path(tmp)
        folder = root / f"wan-{size}"
        for subfolder, config in {"transformer": transformer_config(size),
                                  **SHARED_CONFIGS}.items():
            (folder / subfolder).mkdir(parents=True)
            (folder / subfolder / "config.json").write_text(json.dumps(config))
        make_shapes(root / "data", per_size=1, sizes=((64, 64),))
        config = write_config(root, root / "data", size, model_family="wan",
                              pretrained_model_name_or_path=str(folder), mixed_precision="bf16")
        return plan_in_process(config)

    def test_plan_counts_the_published_parameters_of_wan21_t2v(self):
        with tempfile.TemporaryDirectory(prefix="st-wan-plan-") as tmp:
            for size, published in WAN_PARAMETERS.items():
                output = self.plan(tmp, size)
                ddp, fsdp = row(output, "gradients")  # float32, one per parameter
                self.assertAlmostEqual(ddp / (published * 4 / GIB), 1, delta=0.01, msg=size)
                self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)


if __name__ == "__main__":
    unittest.main()
