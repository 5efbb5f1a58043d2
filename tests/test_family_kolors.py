"""Kolors: the UNet gets what KolorsPipeline gives it (the pipeline's ChatGLM embeddings and
pooled state, SDXL's micro-conditioning), and plan --memory counts the published UNet and
ChatGLM3-6B. Training, resume and export: the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import json
import re
import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from test_memory_plan_command import GIB, SDXL_BASE_UNET, plan_in_process, row
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
# Kwai-Kolors/Kolors-diffusers' configs, the parts that size the tensors: SDXL's UNet with a
# 4096 -> 2048 text projection and the 4096-wide pooled state in its added embedding; SDXL's
# VAE; ChatGLM3-6B.
KOLORS_CONFIGS = {
    "unet": {"_class_name": "UNet2DConditionModel", **SDXL_BASE_UNET, "encoder_hid_dim": 4096,
             "encoder_hid_dim_type": "text_proj",
             "projection_class_embeddings_input_dim": 5632},
    "vae": {"_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 512, 512],
            "down_block_types": ["DownEncoderBlock2D"] * 4, "latent_channels": 4,
            "layers_per_block": 2, "up_block_types": ["UpDecoderBlock2D"] * 4},
    "text_encoder": {"model_type": "chatglm", "num_layers": 28, "padded_vocab_size": 65024,
                     "hidden_size": 4096, "ffn_hidden_size": 13696, "kv_channels": 128,
                     "num_attention_heads": 32, "seq_length": 32768,
                     "multi_query_attention": True, "multi_query_group_num": 2,
                     "add_qkv_bias": True, "original_rope": True},
}
# SDXL's UNet has 2,567,463,684 parameters; Kolors' adds the text projection (4096 x 2048 and
# its bias) and 2816 more inputs to the added embedding's first layer (x 1280).
KOLORS_UNET_PARAMETERS = 2_567_463_684 + 4096 * 2048 + 2048 + (5632 - 2816) * 1280
CHATGLM3_6B_PARAMETERS = 6.24e9  # THUDM/chatglm3-6b
SDXL_VAE_PARAMETERS = 83_653_863


class KolorsTest(TinyModelCase):
    def test_the_unet_gets_what_kolorspipeline_gives_it(self):
        adapter = self.load("kolors")
        seen = {}

        def keep(module, args, kwargs):
            seen.update(kwargs)

        hook = adapter.unet.register_forward_pre_hook(keep, with_kwargs=True)
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        pipeline(PROMPTS[1], width=64, height=64, num_inference_steps=1, guidance_scale=1.0,
                 output_type="latent")
        from_pipeline = dict(seen)
        adapter.compute_loss(random_batch(adapter, 1, prompts=PROMPTS[1:]),
                             torch.Generator().manual_seed(0))
        hook.remove()
        self.assertTrue(torch.equal(from_pipeline["encoder_hidden_states"],
                                    seen["encoder_hidden_states"]))
        self.assertEqual(tuple(seen["encoder_hidden_states"].shape), (1, 256, 32))
        for name in ("text_embeds", "time_ids"):
            self.assertTrue(torch.equal(from_pipeline["added_cond_kwargs"][name],
                                        seen["added_cond_kwargs"][name]), name)
        self.assertEqual(seen["added_cond_kwargs"]["time_ids"].tolist(), [[64, 64, 0, 0, 64, 64]])

    def test_captions_of_different_lengths_are_told_apart(self):
        embeds = self.load("kolors").encode_prompts(list(PROMPTS))
        pooled = embeds["pooled_prompt_embeds"]
        self.assertEqual(tuple(pooled.shape), (2, 32))
        self.assertFalse(torch.allclose(pooled[0], pooled[1]))

    def test_the_builtin_folder_is_told_apart_as_kolors(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-kolors")), "kolors")


class KolorsMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_unet_and_chatglm3(self):
        with tempfile.TemporaryDirectory(prefix="st-kolors-plan-") as tmp:
            root = Path(tmp)
            for subfolder, config in KOLORS_CONFIGS.items():
                (root / "kolors" / subfolder).mkdir(parents=True)
                (root / "kolors" / subfolder / "config.json").write_text(json.dumps(config))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="kolors",
                                  pretrained_model_name_or_path=str(root / "kolors"),
                                  mixed_precision="bf16")
            output = plan_in_process(config)
        count = re.search(r"trained network: ([0-9.]+) B parameters", output).group(1)
        self.assertEqual(float(count), round(KOLORS_UNET_PARAMETERS / 1e9, 2))
        ddp, _ = row(output, "gradients")  # float32, one per parameter
        self.assertAlmostEqual(ddp / (KOLORS_UNET_PARAMETERS * 4 / GIB), 1, delta=0.005)
        # The frozen VAE and ChatGLM3 while caching, in bfloat16.
        frozen = row(output, "VAE + text encoders")[0] * GIB / 2 - SDXL_VAE_PARAMETERS
        self.assertAlmostEqual(frozen / CHATGLM3_6B_PARAMETERS, 1, delta=0.01)


if __name__ == "__main__":
    unittest.main()
