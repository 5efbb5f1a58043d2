"""SANA-Video: the adapter gives the transformer what SanaVideoPipeline gives it (its own
encode_prompt with the default instruction, Wan VAE latents normalised as the pipeline decodes
them, timestep sigma * 1000) and validation's frame count under the pipeline's name; plan
--memory counts the published 2B transformer. Training, resume and export: the conformance
suite (tests/conformance.py)."""

from __future__ import annotations

import inspect
import json
import shutil
import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.registry import get_adapter_class
from test_family_hunyuanvideo import published_gradients
from test_memory_plan_command import GIB

FAMILY = "sanavideo"
# "Model size: 2B parameters" (huggingface.co/Efficient-Large-Model/SANA-Video_2B_480p);
# SanaVideoTransformer3DModel's defaults are that model's transformer.
PUBLISHED_PARAMETERS = 2e9
PUBLISHED_CONFIGS = {
    "transformer": {"_class_name": "SanaVideoTransformer3DModel"},
    "vae": {"_class_name": "AutoencoderKLWan", "base_dim": 96, "z_dim": 16,
            "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "temperal_downsample": [False, True, True]},
    "text_encoder": {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
                     "num_hidden_layers": 26, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000},
}


class SanaVideoAdapterTest(TinyModelCase):
    def test_the_network_gets_what_the_pipeline_gives_it(self):
        adapter = self.load(FAMILY)
        prompts = ["a red circle", "a blue square"]
        batch = random_batch(adapter, 2, height=64, width=96, prompts=prompts)
        self.assertEqual(tuple(batch.latents.shape), (2, 16, 1, 8, 12))  # one-frame clips
        seen = {}

        def zero_network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(5), network=zero_network)
        pipeline = adapter.build_pipeline()
        # What its __call__ encodes by default: its complex human instruction first.
        instruction = inspect.signature(type(pipeline).__call__).parameters[
            "complex_human_instruction"].default
        embeds, mask, _, _ = pipeline.encode_prompt(prompts, do_classifier_free_guidance=False,
                                                    device=CPU,
                                                    complex_human_instruction=instruction)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"], mask))
        self.assertEqual(tuple(embeds.shape), (2, 300, 16))
        # The pipeline decodes latents * std + mean.
        config = adapter.vae.config
        mean = torch.tensor(config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(config.latents_std).view(1, 16, 1, 1, 1)
        pixels = torch.rand(2, 3, 1, 64, 96, generator=torch.Generator().manual_seed(7))
        raw = adapter.vae.encode(pixels * 2 - 1).latent_dist.mode()
        torch.testing.assert_close(batch.latents * std + mean, raw, rtol=1e-4, atol=1e-5)
        timesteps = seen["timestep"]
        sigma = (timesteps / 1000).view(-1, 1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * batch.latents) / sigma
        self.assertAlmostEqual(loss.item(), (noise - batch.latents).pow(2).mean().item(),
                               places=4)

    def test_validation_asks_for_frames_by_the_pipelines_name(self):
        adapter = self.load(FAMILY)
        arguments = adapter.validation_arguments({"guidance_scale": 5.0, "num_frames": 9})
        self.assertEqual(arguments, {"guidance_scale": 5.0, "frames": 9, "output_type": "pil"})
        self.assertEqual(adapter.resolution_alignment, 32)  # the pipeline refuses others


class SanaVideoFolderTest(unittest.TestCase):
    def test_a_folder_with_another_vae_and_other_flavours_are_refused_by_name(self):
        adapter_class = get_adapter_class(FAMILY)
        with tempfile.TemporaryDirectory(prefix="st-sanavideo-") as tmp:
            folder = Path(tmp) / "sana-video-720p"
            shutil.copytree(ensure_builtin_model("tiny-sanavideo"), folder)
            (folder / "vae" / "config.json").write_text(json.dumps(
                {"_class_name": "AutoencoderDC"}))
            with self.assertRaises(ModelFolderError) as raised:
                adapter_class.check_folder(folder)
        self.assertIn("its VAE is AutoencoderDC", str(raised.exception))
        folder = ensure_builtin_model("tiny-sanavideo")
        self.assertIsNone(adapter_class.flavour_problem(folder, "2b-480p"))
        self.assertIn("2b-480p", adapter_class.flavour_problem(folder, "2b-720p"))


class SanaVideoMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_parameters(self):
        ddp, fsdp = published_gradients(FAMILY, PUBLISHED_CONFIGS)  # float32, one a parameter
        self.assertAlmostEqual(ddp / (PUBLISHED_PARAMETERS * 4 / GIB), 1, delta=0.05)
        self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)


if __name__ == "__main__":
    unittest.main()
