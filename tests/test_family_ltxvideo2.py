"""LTX-2 (model_family ltxvideo2): its transformer gets what LTX2Pipeline gives it (the
connectors' video and audio prompt embeddings and mask, packed video latents, audio latents as
long as the pipeline makes for the clip, timestep and sigma as sigma * 1000); a clip without
audio trains video-only (its audio loss weighted 0); plan --memory counts the published 19B
transformer. Full and LoRA runs, resume and export: the conformance suite's row."""

from __future__ import annotations

import inspect
import json
import tempfile
import unittest
from pathlib import Path

import torch
from diffusers import LTX2Pipeline

from model_fixtures import CPU, TinyModelCase
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from test_family_ltxvideo import PROMPTS, clip_batch
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import make_shapes, write_config

# Lightricks/LTX-2's transformer, "19B": its config (LTX-2.0's, as diffusers converts it)
# counts 18.88 B parameters, video and audio streams together.
LTX2_PARAMETERS = 19e9
LTX2_TRANSFORMER = {
    "_class_name": "LTX2VideoTransformer3DModel", "in_channels": 128, "out_channels": 128,
    "num_attention_heads": 32, "attention_head_dim": 128, "cross_attention_dim": 4096,
    "audio_in_channels": 128, "audio_out_channels": 128, "audio_num_attention_heads": 32,
    "audio_attention_head_dim": 64, "audio_cross_attention_dim": 2048, "num_layers": 48,
    "qk_norm": "rms_norm_across_heads", "caption_channels": 3840, "rope_type": "split"}
GEMMA3_12B = {"model_type": "gemma3", "text_config": {
    "model_type": "gemma3_text", "hidden_size": 3840, "intermediate_size": 15360,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 256, "vocab_size": 262208}, "vision_config": {
    "model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
    "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896, "patch_size": 14}}


class LTX2AdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("ltxvideo2")

    def record(self, batch, audio_output=None):
        seen = {}

        def network(**inputs):
            seen.update(inputs)
            audio = inputs["audio_hidden_states"]
            return (torch.zeros_like(inputs["hidden_states"]),
                    audio_output if audio_output is not None else torch.zeros_like(audio))

        return self.adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                         network=network), seen

    def test_the_network_gets_the_pipelines_inputs(self):
        batch = clip_batch(self.adapter)
        clean = batch.latents.float()
        self.assertEqual(tuple(clean.shape), (2, 8, 2, 4, 6))  # 9 frames: 2 latent frames
        loss, seen = self.record(batch)
        self.assertEqual((seen["num_frames"], seen["height"], seen["width"]), (2, 4, 6))
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 2 * 4 * 6, 8))
        self.assertTrue(torch.equal(seen["timestep"], seen["sigma"]))
        sigma = (seen["timestep"] / 1000).view(-1, 1, 1, 1, 1)
        noisy = LTX2Pipeline._unpack_latents(seen["hidden_states"], 2, 4, 6)
        noise = (noisy - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        # A clip without audio: the video loss alone (the network answered zeros for both).
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        # Audio latents as long as LTX2Pipeline makes them for 9 frames at 24 fps: round(9 / 24
        # * 16000 / 160 / 4) = 9, each 2 channels x 2 mel bins wide.
        self.assertEqual(tuple(seen["audio_hidden_states"].shape), (2, 9, 4))
        self.assertEqual(seen["audio_num_frames"], 9)
        self.assertEqual(seen["fps"], 24.0)
        pipeline = self.adapter.build_pipeline()
        embeds, mask, _, _ = pipeline.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False,
                                                    device=CPU)
        video, audio, connector_mask = pipeline.connectors(embeds, mask, padding_side="left")
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], video))
        self.assertTrue(torch.equal(seen["audio_encoder_hidden_states"], audio))
        self.assertTrue(torch.equal(seen["encoder_attention_mask"], connector_mask))
        self.assertNotEqual(int(mask[0].sum()), int(mask[1].sum()))  # left-padded, each its own

    def test_a_clip_without_audio_has_no_audio_loss(self):
        batch = clip_batch(self.adapter)
        silent, _ = self.record(batch)
        loud, _ = self.record(batch, audio_output=torch.full((2, 9, 4), 5.0))
        self.assertEqual(silent.item(), loud.item())

    def test_a_clip_with_audio_adds_its_audio_loss(self):
        batch = clip_batch(self.adapter)
        batch.conditioning = {"audio_latents": torch.randn(2, 9, 4),
                              "has_audio": torch.tensor([1.0, 0.0])}
        quiet, _ = self.record(batch)
        loud, _ = self.record(batch, audio_output=torch.full((2, 9, 4), 5.0))
        self.assertGreater(loud.item(), quiet.item() + 1.0)

    def test_validation_keeps_the_pipelines_guidance_blocks_the_model_has(self):
        default = inspect.signature(LTX2Pipeline.__call__).parameters[
            "spatio_temporal_guidance_blocks"].default
        self.assertTrue(all(block >= 2 for block in default))  # the tiny model has 2 blocks
        arguments = self.adapter.validation_arguments({"num_frames": 9})
        self.assertEqual((arguments["stg_scale"], arguments["audio_stg_scale"]), (0.0, 0.0))
        self.adapter.transformer.config.num_layers = 48  # as the published model's config
        arguments = self.adapter.validation_arguments({"num_frames": 9})
        self.assertEqual(arguments["spatio_temporal_guidance_blocks"], default)
        self.assertNotIn("stg_scale", arguments)

    def test_the_builtin_folder_is_told_apart_as_ltxvideo2(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-ltxvideo2")), "ltxvideo2")


class LTX2MemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_parameters_of_ltx2(self):
        with tempfile.TemporaryDirectory(prefix="st-ltx2-plan-") as tmp:
            root = Path(tmp)
            folder = root / "ltx2"
            for subfolder, config in {"transformer": LTX2_TRANSFORMER,
                                      "vae": {"_class_name": "AutoencoderKLLTX2Video"},
                                      "text_encoder": GEMMA3_12B}.items():
                (folder / subfolder).mkdir(parents=True)
                (folder / subfolder / "config.json").write_text(json.dumps(config))
            (folder / "model_index.json").write_text(json.dumps({"_class_name": "LTX2Pipeline"}))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", "ltx2", model_family="ltxvideo2",
                                  pretrained_model_name_or_path=str(folder),
                                  mixed_precision="bf16")
            ddp, fsdp = row(plan_in_process(config), "gradients")  # float32, one a parameter
            self.assertAlmostEqual(ddp / (LTX2_PARAMETERS * 4 / GIB), 1, delta=0.02)
            self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)


if __name__ == "__main__":
    unittest.main()
