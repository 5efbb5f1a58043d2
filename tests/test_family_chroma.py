"""Chroma: the adapter learns and gives the transformer what ChromaPipeline gives it (packed
latents, ids, sigma, the pipeline's T5 embeddings and attention mask); plan --memory counts the
published 8.9 B parameters. Training, resume and export: the conformance suite
(tests/conformance.py)."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import torch
from diffusers import ChromaPipeline

from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from test_memory_plan_command import GIB, plan_in_process, row
from training_fixtures import make_shapes, write_config

# "Chroma is a 8.9 billion parameter rectified flow transformer" (the model card,
# huggingface.co/lodestones/Chroma; Chroma1-HD and Chroma1-Base share its architecture).
CHROMA_PARAMETERS = 8.9e9
CHROMA1_HD_CONFIGS = {  # lodestones/Chroma1-HD's published configs, what sizes the tensors
    "transformer": {"_class_name": "ChromaTransformer2DModel", "patch_size": 1,
                    "in_channels": 64, "num_layers": 19, "num_single_layers": 38,
                    "attention_head_dim": 128, "num_attention_heads": 24,
                    "joint_attention_dim": 4096, "axes_dims_rope": [16, 56, 56],
                    "approximator_num_channels": 64, "approximator_hidden_dim": 5120,
                    "approximator_layers": 5},
    "vae": {"_class_name": "AutoencoderKL", "latent_channels": 16, "layers_per_block": 2,
            "block_out_channels": [128, 256, 512, 512], "use_quant_conv": False,
            "down_block_types": ["DownEncoderBlock2D"] * 4, "use_post_quant_conv": False,
            "up_block_types": ["UpDecoderBlock2D"] * 4},
    "text_encoder": {"model_type": "t5", "d_model": 4096, "d_ff": 10240, "d_kv": 64,
                     "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
                     "feed_forward_proj": "gated-gelu"},
}


class ChromaAdapterTest(TinyModelCase):
    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        torch.manual_seed(0)
        adapter = self.load("chroma")
        before, after = losses_around_training(adapter, random_batch(adapter, 2), lr=5e-3,
                                               steps=25)
        self.assertLess(after, 0.75 * before, f"{before} -> {after}")

    def test_the_network_gets_what_chroma_pipeline_gives_it(self):
        adapter = self.load("chroma")
        prompts = ["a red circle", "a blue square on a long green background"]
        batch = random_batch(adapter, 2, height=64, width=128, prompts=prompts)  # latent 8 x 16
        loss, seen = self.capture_network_inputs(adapter, batch)
        self.assertEqual(set(seen), {"hidden_states", "timestep", "encoder_hidden_states",
                                     "txt_ids", "img_ids", "attention_mask", "return_dict"})
        pipeline = adapter.build_pipeline()
        embeds, text_ids, mask, *_ = pipeline.encode_prompt(
            prompts, device=CPU, do_classifier_free_guidance=False)
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertTrue(torch.equal(seen["txt_ids"], text_ids))
        packed = ChromaPipeline._pack_latents(batch.latents.float(), 2, 16, 8, 16)
        self.assertEqual(seen["hidden_states"].shape, packed.shape)
        self.assertTrue(torch.equal(seen["attention_mask"], pipeline._prepare_attention_mask(
            2, packed.shape[1], torch.float32, attention_mask=mask)))
        self.assertTrue(torch.equal(seen["img_ids"], ChromaPipeline._prepare_latent_image_ids(
            2, 4, 8, CPU, torch.float32)))
        # The timestep is sigma (the pipeline passes t / 1000); the target is noise - latents.
        sigma = seen["timestep"].view(-1, 1, 1)
        self.assertTrue(bool(((sigma > 0) & (sigma < 1)).all()))
        noise = (seen["hidden_states"] - (1 - sigma) * packed) / sigma
        self.assertAlmostEqual(loss.item(), (noise - packed).pow(2).mean().item(), places=4)
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)

    def test_gradient_checkpointing_keeps_the_loss_and_its_gradients(self):
        adapter = self.load("chroma")
        batch = random_batch(adapter, 2)

        def loss_and_gradients():
            adapter.transformer.zero_grad()
            loss = adapter.compute_loss(batch, torch.Generator().manual_seed(3))
            loss.backward()
            return loss.item(), [p.grad.clone() for p in adapter.transformer.parameters()]

        plain_loss, plain = loss_and_gradients()
        adapter.set_gradient_checkpointing(True)
        checkpointed_loss, checkpointed = loss_and_gradients()
        self.assertEqual(checkpointed_loss, plain_loss)
        for first, second in zip(plain, checkpointed):
            torch.testing.assert_close(second, first, rtol=1e-5, atol=1e-7)
        adapter.set_gradient_checkpointing(False)
        self.assertNotIn("forward", vars(adapter.transformer.single_transformer_blocks[0]))

    def test_folders_of_other_families_are_refused(self):
        def load(family: str, folder: Path):
            get_adapter_class(family).load(folder, device=CPU, weight_dtype=torch.float32,
                                           loss_settings=LossSettings())

        with tempfile.TemporaryDirectory() as tmp:  # Flux's layout: CLIP and T5
            for name in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer",
                         "text_encoder_2", "tokenizer_2"):
                (Path(tmp) / name).mkdir()
            (Path(tmp) / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
            with self.assertRaisesRegex(ModelFolderError, "has text_encoder_2/.*says it is flux"):
                load("chroma", Path(tmp))
        with self.assertRaisesRegex(ModelFolderError, "missing text_encoder_2/.*says it is chroma"):
            load("flux", ensure_builtin_model("tiny-chroma"))


class ChromaConfigTest(unittest.TestCase):
    def load(self, **options):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="chroma",
                                  pretrained_model_name_or_path="builtin:tiny-chroma", **options)
            return load_configuration(config, cwd=root)

    def problems(self, **options) -> str:
        with self.assertRaises(ConfigError) as caught:
            self.load(**options)
        return str(caught.exception)

    def test_flux_lora_target_all_asks_for_the_modules_it_means(self):
        message = self.problems(model_type="lora", flux_lora_target="all")
        self.assertIn("flux_lora_target", message)
        self.assertIn('"add_q_proj"', message)
        # Full training has no targets; named targets say what 'all' would have meant.
        self.load(flux_lora_target="all")
        self.load(model_type="lora", flux_lora_target="all", lora_target_modules=["to_q"])

    def test_options_chroma_has_no_use_for_are_named(self):
        self.assertIn("validation_guidance_rescale", self.problems(validation_guidance_rescale=0.7))
        self.assertIn("flux_guidance_value", self.problems(flux_guidance_value=3.5))
        self.assertIn("Qwen-Image and Chroma: their true classifier-free guidance",
                      self.problems(validation_guidance_real=4.0))


class ChromaMemoryPlanTest(unittest.TestCase):
    def test_plan_counts_the_published_parameters_of_chroma1_hd(self):
        with tempfile.TemporaryDirectory(prefix="st-chroma-plan-") as tmp:
            root = Path(tmp)
            for subfolder, config in CHROMA1_HD_CONFIGS.items():
                (root / "chroma1-hd" / subfolder).mkdir(parents=True)
                (root / "chroma1-hd" / subfolder / "config.json").write_text(json.dumps(config))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="chroma",
                                  pretrained_model_name_or_path=str(root / "chroma1-hd"),
                                  mixed_precision="bf16")
            output = plan_in_process(config)
        self.assertIn("8.90 B parameters", output)
        ddp, fsdp = row(output, "gradients")  # float32, one per parameter
        self.assertAlmostEqual(ddp / (CHROMA_PARAMETERS * 4 / GIB), 1, delta=0.005)
        self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)


if __name__ == "__main__":
    unittest.main()
