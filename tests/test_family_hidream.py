"""HiDream-I1: the transformer gets what HiDreamImagePipeline gives it (the pipeline's T5, Llama
and pooled CLIP embeddings, timestep 1000 * sigma), its training-mode output (patches) is read
back as the latents its inference output is, and plan --memory counts the published 17 B
transformer and its four text encoders. Training, resume and export: the conformance suite
(tests/conformance.py)."""

from __future__ import annotations

import json
import re
import tempfile
import unittest
from pathlib import Path

import torch
from diffusers import AutoencoderKL

from model_fixtures import TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from test_family_chroma import CHROMA1_HD_CONFIGS
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
# HiDream-ai/HiDream-I1-Full's configs, the parts that size the tensors: the transformer, the
# Flux VAE, CLIP-L and CLIP-G with projections (248 positions), T5-XXL's encoder and
# Llama-3.1-8B-Instruct.
HIDREAM_CONFIGS = {
    "transformer": {"_class_name": "HiDreamImageTransformer2DModel", "patch_size": 2,
                    "in_channels": 16, "out_channels": 16, "num_layers": 16,
                    "num_single_layers": 32, "attention_head_dim": 128,
                    "num_attention_heads": 20, "caption_channels": [4096, 4096],
                    "text_emb_dim": 2048, "num_routed_experts": 4, "num_activated_experts": 2,
                    "axes_dims_rope": [64, 32, 32], "max_resolution": [128, 128],
                    "llama_layers": list(range(16)) + [j for i in range(16, 32) for j in (i, i)]},
    "vae": CHROMA1_HD_CONFIGS["vae"],
    "text_encoder": {"model_type": "clip_text_model", "hidden_size": 768,
                     "intermediate_size": 3072, "num_attention_heads": 12,
                     "num_hidden_layers": 12, "projection_dim": 768, "vocab_size": 49408,
                     "max_position_embeddings": 248},
    "text_encoder_2": {"model_type": "clip_text_model", "hidden_size": 1280,
                       "intermediate_size": 5120, "num_attention_heads": 20,
                       "num_hidden_layers": 32, "projection_dim": 1280, "vocab_size": 49408,
                       "max_position_embeddings": 248},
    "text_encoder_3": CHROMA1_HD_CONFIGS["text_encoder"],
    "text_encoder_4": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                       "num_hidden_layers": 32, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "vocab_size": 128256,
                       "tie_word_embeddings": False},
}
HIDREAM_PARAMETERS = 17e9  # "HiDream-I1 ... with 17B parameters" (its model card)
# The model cards' counts: CLIP-L and CLIP-G text models with projections, T5-XXL's encoder,
# Llama-3.1-8B.
TEXT_ENCODER_PARAMETERS = 123.65e6 + 694.66e6 + 4.762e9 + 8.03e9


class HiDreamTest(TinyModelCase):
    def test_the_transformer_gets_what_hidreamimagepipeline_gives_it(self):
        adapter = self.load("hidream")
        seen = {}

        def keep(module, args, kwargs):
            seen.update(kwargs)

        hook = adapter.transformer.register_forward_pre_hook(keep, with_kwargs=True)
        adapter.transformer.eval()  # as validation runs it (pipelines.py)
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        pipeline(list(PROMPTS), width=64, height=64, num_inference_steps=1, guidance_scale=1.0,
                 output_type="latent")
        hook.remove()
        embeds = adapter.encode_prompts(list(PROMPTS))
        self.assertTrue(torch.equal(seen["encoder_hidden_states_t5"], embeds["t5_embeds"]))
        self.assertTrue(torch.equal(seen["pooled_embeds"], embeds["pooled_embeds"]))
        # The pipeline's Llama states are [layers, B, tokens, width]; the cache's batch first.
        llama = seen["encoder_hidden_states_llama3"]
        self.assertEqual(tuple(llama.shape), (2, 2, 32, 16))
        self.assertTrue(torch.equal(llama, embeds["llama_embeds"].transpose(0, 1)))
        sigma = pipeline.scheduler.sigmas[0].item()
        self.assertAlmostEqual(seen["timesteps"][0].item(), 1000 * sigma, places=3)
        # The area of the transformer's max_resolution (16 patches a side), not 1 MP.
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 16, 16, 16))

    def test_the_training_output_is_read_back_as_the_inference_output(self):
        adapter = self.load("hidream")
        for height, width in ((64, 64), (64, 96)):  # a non-square grid is padded to max_seq
            with self.subTest(height=height, width=width):
                batch = random_batch(adapter, 2, height, width, prompts=PROMPTS)
                noisy = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(1))
                sigmas = torch.tensor([0.3, 0.8])
                outputs = []
                for training in (False, True):
                    adapter.transformer.train(training)
                    with torch.no_grad():
                        outputs.append(adapter._predict(adapter.transformer, noisy, sigmas,
                                                        batch, torch.float32))
                self.assertEqual(outputs[1].shape, noisy.shape)
                torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)

    def test_the_builtin_folder_is_told_apart_as_hidream(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-hidream")), "hidream")


class HiDreamMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_transformer_and_text_encoders(self):
        with tempfile.TemporaryDirectory(prefix="st-hidream-plan-") as tmp:
            root = Path(tmp)
            for subfolder, config in HIDREAM_CONFIGS.items():
                (root / "hidream" / subfolder).mkdir(parents=True)
                (root / "hidream" / subfolder / "config.json").write_text(json.dumps(config))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="hidream",
                                  pretrained_model_name_or_path=str(root / "hidream"),
                                  mixed_precision="bf16")
            output = plan_in_process(config)
        count = re.search(r"trained network: ([0-9.]+) B parameters", output).group(1)
        self.assertEqual(round(float(count)), HIDREAM_PARAMETERS / 1e9)
        with torch.device("meta"):
            vae = AutoencoderKL.from_config(HIDREAM_CONFIGS["vae"])
        vae_parameters = sum(p.numel() for p in vae.parameters())
        # The frozen VAE and the four text encoders while caching, in bfloat16.
        frozen = row(output, "VAE + text encoders")[0] * GIB / 2 - vae_parameters
        self.assertAlmostEqual(frozen / TEXT_ENCODER_PARAMETERS, 1, delta=0.01)


if __name__ == "__main__":
    unittest.main()
