"""Z-Image (model_family z_image): the adapter learns and trains on exactly what ZImagePipeline
gives its transformer (per-sample lists, timestep 1 - sigma, the pipeline's own caption
features, its sign); plan --memory on Z-Image's published configs counts its published 6.15 B
parameters. Training, resume and export: the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

import torch
from diffusers import ZImageTransformer2DModel

from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.cli import main
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.lora import add_lora
from simpletuner.training.memory.sharding import repeated_blocks
from simpletuner.training.settings import ValidationSettings
from test_memory_plan_command import GIB, row
from training_fixtures import make_shapes, write_config

# Z-Image's 6.15 B-parameter S3-DiT, as the Z-Image technical report (arXiv 2511.22699) and
# Tongyi-MAI's model cards give it.
Z_IMAGE_PARAMETERS = 6.15e9
Z_IMAGE_CONFIGS = {  # Tongyi-MAI/Z-Image-Turbo's published configs, the parts that size tensors
    "transformer": {"_class_name": "ZImageTransformer2DModel", "all_patch_size": [2],
                    "all_f_patch_size": [1], "in_channels": 16, "dim": 3840, "n_layers": 30,
                    "n_refiner_layers": 2, "n_heads": 30, "n_kv_heads": 30, "qk_norm": True,
                    "cap_feat_dim": 2560, "axes_dims": [32, 48, 48],
                    "axes_lens": [1536, 512, 512]},
    "vae": {"_class_name": "AutoencoderKL", "latent_channels": 16, "layers_per_block": 2,
            "block_out_channels": [128, 256, 512, 512], "use_quant_conv": False,
            "use_post_quant_conv": False, "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4},
    "text_encoder": {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728,
                     "num_hidden_layers": 36, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                     "tie_word_embeddings": True},
}
PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")


class ZImageAdapterTest(TinyModelCase):
    def setUp(self):
        torch.manual_seed(0)
        self.adapter = self.load("z_image")

    def record(self, batch, output=None, **loss):
        """compute_loss's loss and the transformer's inputs; the network answers ``output``
        (inputs -> list of per-sample tensors), zeros by default."""
        seen = {}

        def network(frames, timestep, captions, return_dict=False):
            seen.update(frames=frames, timestep=timestep, captions=captions)
            return (output() if output else [torch.zeros_like(f) for f in frames],)

        adapter = self.load("z_image", **loss) if loss else self.adapter
        return adapter.compute_loss(batch, torch.Generator().manual_seed(3),
                                    network=network), seen

    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        before, after = losses_around_training(self.adapter, random_batch(self.adapter, 4),
                                               lr=2e-3, steps=60)
        self.assertLess(after, 0.75 * before, f"{before} -> {after}")

    def test_the_network_gets_the_pipelines_inputs_and_target(self):
        batch = random_batch(self.adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.record(batch)
        clean = batch.latents.float()
        self.assertEqual([tuple(f.shape) for f in seen["frames"]], [(16, 1, 8, 12)] * 2)
        sigma = (1 - seen["timestep"]).view(-1, 1, 1, 1)  # the pipeline's (1000 - t) / 1000
        noisy = torch.stack(seen["frames"]).squeeze(2)
        noise = (noisy - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.1)
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        # The captions are ZImagePipeline.encode_prompt's own, one length per prompt.
        expected, _ = self.adapter.build_pipeline().encode_prompt(
            list(PROMPTS), device=CPU, do_classifier_free_guidance=False)
        self.assertNotEqual(len(expected[0]), len(expected[1]))
        for given, own in zip(seen["captions"], expected):
            self.assertTrue(torch.equal(given, own))

        # The pipeline steps with minus the output: a network answering latents - noise has
        # no loss, and one Euler step of the pipeline's scheduler with it lands on the latents.
        oracle = clean - noise
        loss, _ = self.record(batch, lambda: list(oracle.unsqueeze(2).unbind(0)))
        self.assertAlmostEqual(loss.item(), 0.0, places=8)
        scheduler = self.adapter.build_pipeline().scheduler
        scheduler = type(scheduler).from_config(scheduler.config, shift=1.0)  # sigma as drawn
        scheduler.set_timesteps(sigmas=[sigma[0].item()], device=CPU)
        stepped = scheduler.step(-oracle[:1], scheduler.timesteps[0], noisy[:1],
                                 return_dict=False)[0]
        self.assertTrue(torch.allclose(stepped, clean[:1], atol=1e-4))

    def test_shift_comes_from_the_scheduler_unless_flow_shift_is_set(self):
        self.assertEqual(self.adapter.sigma_shift(64, 64), 3.0)  # like Z-Image-Turbo's
        batch = random_batch(self.adapter, 2)
        _, seen = self.record(batch, flow_shift=1000.0, flow_timestep_sampling="uniform")
        self.assertTrue(bool((seen["timestep"] < 0.01).all()), seen["timestep"])

    def test_a_prompts_prediction_does_not_depend_on_the_rest_of_its_batch(self):
        """Captions of different lengths share a batch; each sample's prediction is what it
        gets alone."""
        batch = random_batch(self.adapter, 2, prompts=PROMPTS)
        noisy = torch.randn(batch.latents.shape, generator=torch.Generator().manual_seed(1))
        sigmas = torch.tensor([0.3, 0.8])
        with torch.no_grad():
            together = self.adapter._predict(self.adapter.transformer, noisy, sigmas, batch,
                                             torch.float32)
            for i, prompt in enumerate(PROMPTS):
                alone = random_batch(self.adapter, 1, prompts=(prompt,))
                single = self.adapter._predict(self.adapter.transformer, noisy[i:i + 1],
                                               sigmas[i:i + 1], alone, torch.float32)
                self.assertTrue(torch.allclose(together[i:i + 1], single, atol=1e-5), prompt)

    def test_default_lora_targets_are_every_blocks_attention_projections(self):
        network = self.adapter.transformer
        add_lora(network, type(self.adapter), rank=2)
        wrapped = {name.rsplit(".lora_A", 1)[0] for name, _ in network.named_parameters()
                   if ".lora_A." in name}
        blocks = len(network.noise_refiner) + len(network.context_refiner) + len(network.layers)
        self.assertEqual(len(wrapped), 4 * blocks)
        self.assertTrue(all(".attention." in name for name in wrapped), wrapped)

    def test_builtin_folder_has_the_pipelines_layout_and_stays_tiny(self):
        folder = ensure_builtin_model("tiny-z_image")
        index = json.loads((folder / "model_index.json").read_text())
        self.assertEqual((index["_class_name"], index["text_encoder"][1]),
                         ("ZImagePipeline", "Qwen3Model"))
        self.assertEqual({p.name for p in folder.iterdir() if p.is_dir()},
                         {"transformer", "vae", "scheduler", "text_encoder", "tokenizer"})
        self.assertLess(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()),
                        5 * 2**20)
        text = self.adapter.tokenizers[0].apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True,
            enable_thinking=True)
        self.assertEqual(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

    def test_other_families_folders_are_refused_by_name(self):
        with self.assertRaisesRegex(ModelFolderError, "has text_encoder_2/.*says it is flux"):
            get_adapter_class("z_image").load(ensure_builtin_model("tiny-flux"), device=CPU,
                                              weight_dtype=torch.float32,
                                              loss_settings=LossSettings())
        with self.assertRaisesRegex(ModelFolderError, "says it is z_image"):
            get_adapter_class("sd3").load(ensure_builtin_model("tiny-z_image"), device=CPU,
                                          weight_dtype=torch.float32,
                                          loss_settings=LossSettings())

    def test_a_folder_with_z_images_subfolders_but_another_pipeline_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(shutil.copytree(ensure_builtin_model("tiny-z_image"),
                                          Path(tmp) / "other"))
            index = json.loads((folder / "model_index.json").read_text())
            (folder / "model_index.json").write_text(
                json.dumps(dict(index, _class_name="FluxPipeline")))
            with self.assertRaisesRegex(ModelFolderError, "names another pipeline.*says it is "
                                        "flux: set model_family to match"):
                get_adapter_class("z_image").load(folder, device=CPU,
                                                  weight_dtype=torch.float32,
                                                  loss_settings=LossSettings())


class ZImageShardingTest(unittest.TestCase):
    def test_fsdp_shards_the_three_block_lists_and_nothing_else_heavy(self):
        with torch.device("meta"):
            network = ZImageTransformer2DModel.from_config(Z_IMAGE_CONFIGS["transformer"])
        found = repeated_blocks(network)
        lists = [*network.noise_refiner, *network.context_refiner, *network.layers]
        self.assertEqual(found[:len(lists)], lists)
        rest = sum(p.numel() for block in found[len(lists):] for p in block.parameters())
        self.assertLess(rest, 1e-3 * sum(p.numel() for p in network.parameters()))


class ZImageConfigTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.enterClassContext(tempfile.TemporaryDirectory(prefix="st-z-config-"))
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=1, sizes=((64, 64),))

    def configuration(self, **options):
        return load_configuration(write_config(
            self.root, self.root / "data", model_family="z_image",
            pretrained_model_name_or_path="builtin:tiny-z_image", **options), cwd=self.root)

    def test_guidance_off_is_guidance_scale_zero(self):
        training = self.configuration(validation_disable_unconditional=True).training
        self.assertEqual(ValidationSettings.from_config(training).pipeline_arguments(),
                         {"guidance_scale": 0.0})
        training = self.configuration(validation_guidance_scale=4.0).training
        self.assertEqual(ValidationSettings.from_config(training).pipeline_arguments(),
                         {"guidance_scale": 4.0})

    def test_options_zimagepipeline_lacks_are_refused_by_name(self):
        for option, message in (
                (dict(validation_guidance_rescale=0.7), "sd2x and sdxl; the z_image pipeline "
                 "has no guidance rescale"),  # the families whose pipelines take it, listed
                (dict(flux_guidance_value=3.5), "'flux_guidance_value' applies to model_families "
                 "'flux' and 'flux2' only")):
            with self.subTest(option=option), self.assertRaises(ConfigError) as caught:
                self.configuration(**option)
            self.assertIn(message, str(caught.exception))


class ZImagePlanTest(unittest.TestCase):
    def test_plan_counts_the_published_parameters_of_the_real_model(self):
        with tempfile.TemporaryDirectory(prefix="st-z-plan-") as tmp:
            root = Path(tmp)
            for subfolder, config in Z_IMAGE_CONFIGS.items():
                (root / "z-image" / subfolder).mkdir(parents=True)
                (root / "z-image" / subfolder / "config.json").write_text(json.dumps(config))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="z_image",
                                  pretrained_model_name_or_path=str(root / "z-image"),
                                  mixed_precision="bf16")
            printed = io.StringIO()
            with redirect_stdout(printed):  # in-process: no interpreter and torch start-up
                status = main(["plan", "--memory", "--config", str(config),
                               "--num-processes", "8"])
        output = printed.getvalue()
        self.assertEqual(status, 0, output)
        self.assertIn(f"{Z_IMAGE_PARAMETERS / 1e9:.2f} B parameters", output)
        ddp, fsdp = row(output, "gradients")  # float32, one per parameter
        self.assertAlmostEqual(ddp / (Z_IMAGE_PARAMETERS * 4 / GIB), 1, delta=0.005)
        self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)
        # Qwen3-4B (4.02 B parameters) and the 84 M-parameter VAE in bfloat16 while caching
        self.assertAlmostEqual(row(output, "VAE + text encoders")[0], 4.106e9 * 2 / GIB,
                               delta=0.05)


if __name__ == "__main__":
    unittest.main()
