"""LTX-Video 0.9.x (model_family ltxvideo): its transformer gets what LTXPipeline gives it
(packed latents, the pipeline's own prompt embeddings and mask, timestep sigma * 1000, the
latent grid and RoPE scale) and learns the flow velocity; noise levels are shifted by the clip's
token count; its ComfyUI file loads in diffusers as its own file does; plan --memory counts the
published 2B and 13B transformers. Full and LoRA runs, resume and export: the conformance
suite's row (tests/conformance.py)."""

from __future__ import annotations

import json
import re
import tempfile
import unittest
from pathlib import Path

import torch
from diffusers import LTXPipeline

from model_fixtures import CPU, TinyModelCase
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.flow_objective import resolution_shift
from simpletuner.models.layout import guess_family
from simpletuner.models.training_batch import TrainingBatch
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
# The published transformers are named by their sizes, "2B" (LTX-Video 0.9.0 to 0.9.6, 0.9.8
# 2B) and "13B" (0.9.7, 0.9.8 13B); their configs (Lightricks/LTX-Video*, transformer/) count
# 1.92 B and 13.04 B parameters.
LTX_PARAMETERS = {"2b": 2e9, "13b": 13e9}
LTX_CONFIGS = {"2b": {"num_attention_heads": 32, "attention_head_dim": 64,
                      "cross_attention_dim": 2048, "num_layers": 28},
               "13b": {"num_attention_heads": 32, "attention_head_dim": 128,
                       "cross_attention_dim": 4096, "num_layers": 48}}
SHARED_CONFIGS = {
    "vae": {"_class_name": "AutoencoderKLLTXVideo", "latent_channels": 128},
    "text_encoder": {"model_type": "t5", "d_model": 4096, "d_ff": 10240, "d_kv": 64,
                     "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
                     "feed_forward_proj": "gated-gelu"},
}


def clip_batch(adapter, frames: int = 9, height: int = 32, width: int = 48) -> TrainingBatch:
    """Two seeded random clips with PROMPTS (LTX-2's tests too)."""
    pixels = torch.rand(2, 3, frames, height, width, generator=torch.Generator().manual_seed(7))
    return TrainingBatch(latents=adapter.encode_images(pixels * 2 - 1),
                         prompt_embeds=adapter.encode_prompts(list(PROMPTS)),
                         original_sizes=[(height, width)] * 2, crop_top_lefts=[(0, 0)] * 2,
                         target_sizes=[(height, width)] * 2)


class LTXVideoAdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("ltxvideo")

    def record(self, batch, output=None):
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            return (output(inputs) if output else torch.zeros_like(inputs["hidden_states"]),)

        return self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=network), seen

    def test_the_network_gets_the_pipelines_inputs_and_learns_the_velocity(self):
        batch = clip_batch(self.adapter)
        clean = batch.latents.float()  # [2, 8, 2, 4, 6]: 9 frames are 2 latent frames
        self.assertEqual(tuple(clean.shape), (2, 8, 2, 4, 6))
        loss, seen = self.record(batch)
        self.assertEqual((seen["num_frames"], seen["height"], seen["width"]), (2, 4, 6))
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 2 * 4 * 6, 8))
        self.assertEqual(seen["rope_interpolation_scale"], (8 / 25, 8, 8))  # pipeline default
        noisy = LTXPipeline._unpack_latents(seen["hidden_states"], 2, 4, 6)
        sigma = (seen["timestep"] / 1000).view(-1, 1, 1, 1, 1)  # the scheduler's sigma * 1000
        noise = (noisy - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        embeds, mask, _, _ = self.adapter.build_pipeline().encode_prompt(
            list(PROMPTS), do_classifier_free_guidance=False, device=CPU)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"], mask))
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))
        # The scheduler steps with the output as noise - latents: answering it costs nothing.
        velocity = LTXPipeline._pack_latents(noise - clean)
        loss, _ = self.record(batch, lambda inputs: velocity)
        self.assertAlmostEqual(loss.item(), 0.0, places=8)

    def test_noise_levels_are_shifted_by_the_clips_token_count(self):
        latents = torch.zeros(4096, 8, 3, 16, 16)  # 768 tokens a clip
        shift = resolution_shift(3 * 16 * 16, self.adapter.scheduler.config)
        self.assertGreater(shift, resolution_shift(16 * 16, self.adapter.scheduler.config))
        drawn = self.adapter.draw_sigmas(latents, torch.Generator().manual_seed(0))
        unshifted = self.load("ltxvideo", flow_shift=1.0).draw_sigmas(
            latents, torch.Generator().manual_seed(0))
        expected = shift * unshifted / (1 + (shift - 1) * unshifted)
        self.assertTrue(torch.allclose(drawn, expected, atol=1e-6))

    def test_the_builtin_folder_is_told_apart_as_ltxvideo(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-ltxvideo")), "ltxvideo")


class LTXVideoMemoryPlanTest(unittest.TestCase):
    def plan(self, root: Path, size: str) -> str:
        folder = root / f"ltx-{size}"
        transformer = {"_class_name": "LTXVideoTransformer3DModel", "in_channels": 128,
                       "out_channels": 128, "caption_channels": 4096,
                       "qk_norm": "rms_norm_across_heads", **LTX_CONFIGS[size]}
        for subfolder, config in {"transformer": transformer, **SHARED_CONFIGS}.items():
            (folder / subfolder).mkdir(parents=True)
            (folder / subfolder / "config.json").write_text(json.dumps(config))
        (folder / "model_index.json").write_text(json.dumps({"_class_name": "LTXPipeline"}))
        make_shapes(root / "data", per_size=1, sizes=((64, 64),))
        config = write_config(root, root / "data", size, model_family="ltxvideo",
                              pretrained_model_name_or_path=str(folder), mixed_precision="bf16")
        return plan_in_process(config)

    def test_plan_counts_the_published_parameters_of_ltx_video(self):
        with tempfile.TemporaryDirectory(prefix="st-ltx-plan-") as tmp:
            for size, published in LTX_PARAMETERS.items():
                output = self.plan(Path(tmp), size)
                self.assertRegex(output, re.escape("trained network: ") + r"[0-9.]+ B")
                ddp, fsdp = row(output, "gradients")  # float32, one per parameter
                self.assertAlmostEqual(ddp / (published * 4 / GIB), 1, delta=0.05, msg=size)
                self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)


if __name__ == "__main__":
    unittest.main()
