"""HunyuanVideo 1.5: the adapter gives the transformer what HunyuanVideo15Pipeline gives it (its
own encode_prompt's four tensors, latents * scaling_factor, timestep sigma * 1000, the zero
condition channels and masked image tokens of text-to-video); SimpleTuner's flavour names are
checked against the folder and HunyuanVideo 1.0 folders refused by name; validation's guidance
scale reaches the pipeline's guider. Training, resume and export: the conformance suite
(tests/conformance.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import CPU, TinyModelCase, random_batch
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import make_shapes, write_config
from simpletuner.configuration import TrainingConfig
from simpletuner.models.block_count import swappable_block_count
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.families.wan.i2v import as_pil_images
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.lora import add_lora, export_lora
from simpletuner.training.adapters.lora_init import init_adapter
from simpletuner.training.reporting.model_card import write_model_card

FAMILY = "hunyuanvideo"
# "8.3B parameters" (huggingface.co/tencent/HunyuanVideo-1.5): the transformer of every
# published 480p and 720p flavour; HunyuanVideo15Transformer3DModel's defaults are its config.
PUBLISHED_PARAMETERS = 8.3e9
PUBLISHED_CONFIGS = {  # hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v's
    "transformer": {"_class_name": "HunyuanVideo15Transformer3DModel", "task_type": "t2v"},
    "vae": {"_class_name": "AutoencoderKLHunyuanVideo15"},
    "text_encoder": {"model_type": "qwen2_5_vl_text", "hidden_size": 3584,  # Qwen2.5-VL-7B
                     "intermediate_size": 18944, "num_hidden_layers": 28,
                     "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064},
    "text_encoder_2": {"model_type": "t5", "d_model": 1472, "d_ff": 3584, "d_kv": 64,  # ByT5
                       "num_heads": 6, "num_layers": 12, "vocab_size": 1510,
                       "feed_forward_proj": "gated-gelu"},
}


def capture(adapter, batch):
    """compute_loss with a network that records its inputs and predicts zeros."""
    seen = {}

    def zero_network(**inputs):
        seen.update(inputs)
        return (torch.zeros_like(batch.latents),)

    loss = adapter.compute_loss(batch, torch.Generator().manual_seed(5), network=zero_network)
    return loss, seen


class HunyuanVideoAdapterTest(TinyModelCase):
    def test_the_network_gets_what_the_pipeline_gives_it(self):
        adapter = self.load(FAMILY)
        prompts = ["a red circle", 'a sign that says "hello"']
        batch = random_batch(adapter, 2, height=48, width=64, prompts=prompts)
        self.assertEqual(tuple(batch.latents.shape), (2, 4, 1, 3, 4))  # one-frame clips, 16x
        loss, seen = capture(adapter, batch)
        pipeline = adapter.build_pipeline()
        expected = pipeline.encode_prompt(prompts, device=CPU, batch_size=2)
        names = ("encoder_hidden_states", "encoder_attention_mask", "encoder_hidden_states_2",
                 "encoder_attention_mask_2")
        for name, tensor in zip(names, expected):
            self.assertTrue(torch.equal(seen[name], tensor), name)
        self.assertEqual(tuple(seen["encoder_hidden_states"].shape), (2, 1000, 16))
        # ByT5 reads the quoted text only: the first prompt has none.
        self.assertEqual(seen["encoder_attention_mask_2"].sum(dim=1).tolist()[0], 0)
        self.assertGreater(seen["encoder_attention_mask_2"].sum(dim=1).tolist()[1], 0)
        # The noisy latents, then zero condition latents and a zero mask (text-to-video).
        hidden = seen["hidden_states"]
        self.assertEqual(tuple(hidden.shape), (2, 9, 1, 3, 4))
        self.assertFalse(bool(hidden[:, 4:].any()))
        self.assertEqual(tuple(seen["image_embeds"].shape), (2, 729, 12))
        self.assertFalse(bool(seen["image_embeds"].any()))
        # The pipeline decodes latents / scaling_factor.
        pixels = torch.rand(2, 3, 48, 64, generator=torch.Generator().manual_seed(7))
        raw = torch.cat([adapter.vae.encode((p * 2 - 1)[None, :, None]).latent_dist.mode()
                         for p in pixels])
        torch.testing.assert_close(batch.latents / adapter.vae.config.scaling_factor, raw)
        # timestep sigma * 1000 (FlowMatchEuler's), target noise - latents.
        timesteps = seen["timestep"]
        self.assertTrue(bool(((timesteps > 0) & (timesteps < 1000)).all()))
        sigma = (timesteps / 1000).view(-1, 1, 1, 1, 1)
        noise = (hidden[:, :4] - (1 - sigma) * batch.latents) / sigma
        self.assertAlmostEqual(loss.item(), (noise - batch.latents).pow(2).mean().item(),
                               places=4)

    def test_clips_of_several_latent_frames_train(self):
        adapter = self.load(FAMILY)
        clips = torch.rand(1, 3, 9, 48, 64, generator=torch.Generator().manual_seed(3)) * 2 - 1
        latents = adapter.encode_images(clips)
        self.assertEqual(tuple(latents.shape), (1, 4, 3, 3, 4))  # 9 frames: 1 + 8 / 4
        batch = random_batch(adapter, 1)
        batch.latents = latents
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(0))
        loss.backward()
        self.assertTrue(torch.isfinite(loss))
        self.assertIsNotNone(adapter.transformer.proj_out.weight.grad)

    def test_block_swap_moves_the_dual_stream_blocks_the_spec_counts(self):
        adapter = self.load(FAMILY)
        blocks = type(adapter).swappable_blocks(adapter.transformer)
        self.assertEqual(blocks, list(adapter.transformer.transformer_blocks))
        self.assertEqual(swappable_block_count(FAMILY, "builtin:tiny-hunyuanvideo"), 1)

    def test_validation_guidance_is_the_guider_of_the_validation_pipeline_only(self):
        adapter = self.load(FAMILY)
        pipeline = adapter.validation_pipeline(adapter.build_pipeline(),
                                               {"guidance_scale": 1.0})
        self.assertEqual(pipeline.guider.guidance_scale, 1.0)
        self.assertEqual(pipeline.guider.num_conditions, 1)  # no unconditional pass
        self.assertEqual(adapter.build_pipeline().guider.guidance_scale, 6.0)  # as loaded


class HunyuanVideoLoraFileTest(TinyModelCase):
    def test_the_exported_lora_loads_by_the_model_cards_line_and_as_init_lora(self):
        adapter = self.load(FAMILY)
        add_lora(adapter.transformer, type(adapter), rank=4)
        with torch.no_grad():  # B starts at zero: give the adapter an effect
            for name, parameter in adapter.transformer.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(generator=torch.Generator().manual_seed(1))
        with tempfile.TemporaryDirectory(prefix="st-hunyuanvideo-lora-") as tmp:
            export_lora(type(adapter), adapter.transformer, Path(tmp))
            settings = TrainingConfig(
                model_family=FAMILY, pretrained_model_name_or_path="builtin:tiny-hunyuanvideo",
                output_dir=tmp, data_backend_config="d.json", model_type="lora", lora_rank=4)
            card = write_model_card(Path(tmp) / "lora", settings, {}, [], Path(tmp))
            line = next(line for line in card.read_text().splitlines() if "lora" in line
                        and line.startswith("pipeline."))
            pipeline = adapter.pipeline_class.from_pretrained(
                ensure_builtin_model("tiny-hunyuanvideo"))
            exec(line.replace('"lora"', json.dumps(str(Path(tmp) / "lora"))),
                 {"pipeline": pipeline})
            fresh = self.load(FAMILY)  # init_lora reads it through the same class
            add_lora(fresh.transformer, type(fresh), rank=4)
            init_adapter(fresh, Path(tmp) / "lora" / "pytorch_lora_weights.safetensors")
        self.assertIn("load_lora_adapter", line)  # the pipeline has no load_lora_weights
        loaded = dict(pipeline.transformer.named_parameters())
        for name, parameter in adapter.transformer.named_parameters():
            if "lora_B" in name:
                self.assertTrue(torch.equal(
                    loaded[name.replace(".default.", ".default_0.")], parameter), name)
        started = dict(fresh.transformer.named_parameters())
        for name, parameter in adapter.transformer.named_parameters():
            if "lora_" in name:
                self.assertTrue(torch.equal(started[name], parameter), name)


class HunyuanVideoI2VTest(TinyModelCase):
    def test_the_network_gets_what_the_image_to_video_pipeline_gives_it(self):
        adapter = get_adapter_class(FAMILY).load(
            ensure_builtin_model("tiny-hunyuanvideo-i2v"), device=CPU,
            weight_dtype=torch.float32, loss_settings=LossSettings())
        levels = torch.randint(0, 256, (1, 3, 5, 48, 64),
                               generator=torch.Generator().manual_seed(2))
        clip = levels / 255 * 2 - 1  # exactly what a PIL image of its first frame holds
        cached = adapter.encode_for_cache(clip)
        pipeline = adapter.build_pipeline()
        image = as_pil_images(clip[:, :, 0])[0]
        torch.testing.assert_close(cached["image_latents"], pipeline._get_image_latents(
            pipeline.vae, pipeline.video_processor, image, 48, 64, CPU))
        torch.testing.assert_close(cached["image_embeds"], pipeline.encode_image(
            image, batch_size=1, device=CPU, dtype=torch.float32))
        batch = random_batch(adapter, 1)
        batch.latents = cached["latent"]
        batch.conditioning = {"image_latents": cached["image_latents"],
                              "image_embeds": cached["image_embeds"]}
        _, seen = capture(adapter, batch)
        hidden = seen["hidden_states"]  # noisy latents, condition latents, mask
        self.assertEqual(tuple(hidden.shape), (1, 9, 2, 3, 4))
        self.assertTrue(torch.equal(hidden[:, 4:8, :1], cached["image_latents"]))
        self.assertFalse(bool(hidden[:, 4:8, 1:].any()))
        self.assertTrue(bool((hidden[:, 8, 0] == 1).all()))
        self.assertFalse(bool(hidden[:, 8, 1:].any()))
        self.assertTrue(torch.equal(seen["image_embeds"], cached["image_embeds"]))


class HunyuanVideoFolderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-hunyuanvideo-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def copy(self, class_name: str) -> Path:
        folder = self.tmp / class_name
        shutil.copytree(ensure_builtin_model("tiny-hunyuanvideo"), folder)
        index = json.loads((folder / "model_index.json").read_text())
        (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": class_name}))
        return folder

    def test_flavours_are_checked_against_the_folder(self):
        adapter = get_adapter_class(FAMILY)
        folder = ensure_builtin_model("tiny-hunyuanvideo")
        self.assertIsNone(adapter.flavour_problem(folder, "t2v-480p"))
        self.assertIsNone(adapter.flavour_problem(folder, None))
        self.assertIn("image-to-video", adapter.flavour_problem(folder, "i2v-720p"))
        self.assertIn("t2v-480p-distilled", adapter.flavour_problem(folder, "t2v-1080p"))

    def test_a_hunyuanvideo_10_folder_is_refused_by_name(self):
        folder = self.copy("HunyuanVideoPipeline")
        with self.assertRaises(ModelFolderError) as raised:
            get_adapter_class(FAMILY).check_folder(folder)
        self.assertIn("HunyuanVideoPipeline", str(raised.exception))
        self.assertIn("HunyuanVideo15Pipeline", str(raised.exception))



def published_gradients(family: str, configs: dict) -> tuple[float, float]:
    """plan --memory's gradients row (GiB per rank, DDP and FSDP2 over 8) for a folder of the
    published model's config files ``configs`` (subfolder -> config.json)."""
    with tempfile.TemporaryDirectory(prefix=f"st-{family}-plan-") as tmp:
        root = Path(tmp)
        for subfolder, config in configs.items():
            (root / "model" / subfolder).mkdir(parents=True)
            (root / "model" / subfolder / "config.json").write_text(json.dumps(config))
        make_shapes(root / "data", per_size=1, sizes=((64, 64),))
        config = write_config(root, root / "data", "plan", model_family=family,
                              pretrained_model_name_or_path=str(root / "model"),
                              mixed_precision="bf16")
        ddp, fsdp = row(plan_in_process(config), "gradients")
    return ddp, fsdp


class HunyuanVideoMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_parameters(self):
        ddp, fsdp = published_gradients(FAMILY, PUBLISHED_CONFIGS)  # float32, one a parameter
        self.assertAlmostEqual(ddp / (PUBLISHED_PARAMETERS * 4 / GIB), 1, delta=0.01)
        self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)

    def test_plan_estimates_the_activations_of_its_sequence(self):
        with tempfile.TemporaryDirectory(prefix="st-hunyuanvideo-plan-") as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", "plan", model_family=FAMILY,
                                  pretrained_model_name_or_path="builtin:tiny-hunyuanvideo")
            output = plan_in_process(config)
        # the 1985 text, glyph and (masked) image tokens beside the video's: tens of MiB
        activations, = row(output, "activations (saved for the backward)")
        self.assertGreater(activations * 1024, 10)


if __name__ == "__main__":
    unittest.main()
