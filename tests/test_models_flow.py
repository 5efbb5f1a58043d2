"""Flow-matching families (SD3, Flux): they learn, follow the rectified-flow objective, export
pipelines diffusers loads, and refuse UNet folders."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import FluxPipeline
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from transformers import T5Tokenizer

from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.flow_objective import resolution_shift, sample_sigmas, shift_sigmas
from simpletuner.models.pipelines import export_pipeline
from simpletuner.models.registry import get_adapter_class

FAMILIES = ("sd3", "flux")


class FlowCase(TinyModelCase):
    def fixed_batch(self, adapter, count: int = 4, height: int = 64, width: int = 64):
        return random_batch(adapter, count, height, width)


class LossFallsTest(FlowCase):
    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        for family in FAMILIES:
            with self.subTest(family=family):
                torch.manual_seed(0)
                adapter = self.load(family)
                before, after = losses_around_training(adapter, self.fixed_batch(adapter),
                                                       lr=2e-3, steps=60)
                self.assertLess(after, 0.75 * before, f"{family}: {before} -> {after}")


class FlowObjectiveTest(FlowCase):
    def test_sd3_target_is_noise_minus_latents_at_timestep_sigma_times_1000(self):
        """With a zero prediction the loss is the mean square of the target; the noise is
        recovered from the noisy input as (noisy - (1 - sigma) * latents) / sigma."""
        adapter = self.load("sd3")
        batch = self.fixed_batch(adapter)
        loss, seen = self.capture_network_inputs(adapter, batch)
        sigma = (seen["timestep"] / 1000.0).view(-1, 1, 1, 1)
        clean = batch.latents.float()
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.1)  # it really is the noise
        self.assertTrue(torch.equal(seen["pooled_projections"],
                                    batch.prompt_embeds["pooled_prompt_embeds"]))

    def test_flux_packs_latents_with_position_ids_and_guidance(self):
        """Packing, ids and the objective checked against diffusers' own FluxPipeline helpers."""
        adapter = self.load("flux", flux_guidance_value=3.5)
        batch = self.fixed_batch(adapter, count=2, height=64, width=128)  # latent 8 x 16
        loss, seen = self.capture_network_inputs(adapter, batch)
        clean = batch.latents.float()
        packed = FluxPipeline._pack_latents(clean, 2, 16, 8, 16)
        self.assertEqual(seen["hidden_states"].shape, packed.shape)
        sigma = seen["timestep"].view(-1, 1, 1)  # Flux takes sigma itself
        noise = (seen["hidden_states"] - (1 - sigma) * packed) / sigma
        self.assertAlmostEqual(loss.item(), (noise - packed).pow(2).mean().item(), places=4)
        self.assertTrue(torch.equal(seen["img_ids"],
                                    FluxPipeline._prepare_latent_image_ids(2, 4, 8, CPU,
                                                                           torch.float32)))
        self.assertEqual(seen["txt_ids"].shape, (batch.prompt_embeds["prompt_embeds"].shape[1], 3))
        self.assertEqual(seen["guidance"].tolist(), [3.5, 3.5])

    def test_timestep_options_reach_the_network(self):
        adapter = self.load("sd3", flow_shift=1000.0, flow_timestep_sampling="uniform")
        _, seen = self.capture_network_inputs(adapter, self.fixed_batch(adapter))
        self.assertTrue(bool((seen["timestep"] > 990).all()), seen["timestep"])

    def test_default_shift_comes_from_the_scheduler(self):
        sd3, flux = self.load("sd3"), self.load("flux")
        self.assertEqual(sd3.sigma_shift(128, 128), 3.0)  # the SD3 scheduler's fixed shift
        # Flux shifts by resolution: 64 x 64 latents are 1024 packed tokens.
        expected = np.exp(calculate_shift(1024, 256, 4096, 0.5, 1.15))
        self.assertAlmostEqual(flux.sigma_shift(64, 64), expected, places=6)
        self.assertEqual(self.load("flux", flow_shift=2.0).shift_for(torch.zeros(1, 16, 64, 64)),
                         2.0)

    def test_flow_shift_0_is_no_shift_and_auto_shift_goes_by_tokens_over_flow_shift(self):
        """SimpleTuner's order: flow_schedule_auto_shift, then a static flow_shift (0: none)."""
        self.assertEqual(self.load("sd3", flow_shift=0.0).shift_for(torch.zeros(1, 16, 64, 64)),
                         1.0)
        auto = self.load("sd3", flow_shift=3.0, flow_schedule_auto_shift=True)
        for shape, tokens in (((2, 16, 64, 64), 32 * 32), ((1, 16, 32, 96), 16 * 48),
                              ((1, 16, 3, 8, 8), 3 * 4 * 4)):  # a clip: frames count
            self.assertAlmostEqual(auto.shift_for(torch.zeros(shape)),
                                   np.exp(calculate_shift(tokens, 256, 4096, 0.5, 1.15)),
                                   places=6, msg=str(shape))

    def test_auto_shift_reaches_the_network(self):
        """The same draws as a static flow_shift of the latents' auto shift."""
        auto = self.load("sd3", flow_shift=1000.0, flow_schedule_auto_shift=True)
        batch = self.fixed_batch(auto)
        _, seen = self.capture_network_inputs(auto, batch)
        height, width = batch.latents.shape[-2:]
        tokens = (height // 2) * (width // 2)
        static = self.load("sd3", flow_shift=float(np.exp(calculate_shift(tokens, 256, 4096,
                                                                           0.5, 1.15))))
        _, expected = self.capture_network_inputs(static, batch)
        torch.testing.assert_close(seen["timestep"], expected["timestep"])
        self.assertLess(seen["timestep"].min().item(), 990)


class TimestepSamplingTest(unittest.TestCase):
    def draw(self, **options):
        return sample_sigmas(200_000, device=CPU, generator=torch.Generator().manual_seed(0),
                             **options)

    def test_uniform_covers_the_unit_interval_evenly(self):
        sigmas = self.draw(sampling="uniform")
        quartiles = torch.quantile(sigmas[:100_000], torch.tensor([0.25, 0.5, 0.75]))
        self.assertTrue(torch.allclose(quartiles, torch.tensor([0.25, 0.5, 0.75]), atol=0.01))
        self.assertTrue(bool(((sigmas > 0) & (sigmas < 1)).all()))

    def test_logit_normal_has_median_sigmoid_of_the_mean_and_its_spread(self):
        sigmas = self.draw(sampling="logit_normal", logit_mean=1.0, logit_std=0.5)
        self.assertAlmostEqual(sigmas.median().item(), 1 / (1 + np.exp(-1.0)), delta=0.005)
        logits = torch.log(sigmas / (1 - sigmas))
        self.assertAlmostEqual(logits.std().item(), 0.5, delta=0.01)
        # Mass concentrates in the middle compared with uniform.
        centred = self.draw(sampling="logit_normal")
        self.assertGreater(((centred > 0.25) & (centred < 0.75)).float().mean().item(), 0.7)

    def test_shift_moves_mass_toward_noise_and_keeps_the_ends(self):
        plain = self.draw(sampling="uniform")
        shifted = self.draw(sampling="uniform", shift=3.0)
        self.assertAlmostEqual(shifted.median().item(), 0.75, delta=0.01)  # 3*.5 / (1 + 2*.5)
        self.assertTrue(bool((shifted >= plain).all()))
        ends = torch.tensor([0.0, 1.0])
        self.assertTrue(torch.equal(shift_sigmas(ends, 3.0), ends))
        self.assertTrue(torch.equal(shift_sigmas(plain, 1.0), plain))

    def test_resolution_shift_matches_diffusers(self):
        config = {"base_image_seq_len": 256, "max_image_seq_len": 4096, "base_shift": 0.5,
                  "max_shift": 1.15}
        for tokens in (256, 1024, 4096):
            self.assertAlmostEqual(resolution_shift(tokens, config),
                                   np.exp(calculate_shift(tokens, 256, 4096, 0.5, 1.15)))

    def test_unknown_sampling_is_named(self):
        with self.assertRaisesRegex(ValueError, "uniform, logit_normal"):
            self.draw(sampling="beta")


class FlowExportTest(FlowCase):
    def test_export_loads_in_diffusers_with_the_trained_weights_and_generates(self):
        for family, class_name in (("sd3", "StableDiffusion3Pipeline"), ("flux", "FluxPipeline")):
            with self.subTest(family=family), tempfile.TemporaryDirectory() as output:
                adapter = self.load(family)
                batch = self.fixed_batch(adapter, count=2)
                optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=1e-2)
                adapter.compute_loss(batch, torch.Generator().manual_seed(0)).backward()
                optimizer.step()
                folder = export_pipeline(adapter.build_pipeline(), Path(output))
                image = self.assert_export_loads(adapter, folder, class_name, 96, 64)
                self.assertGreater(np.asarray(image).std(), 0.0)


class FlowBuiltinTest(FlowCase):
    def test_folders_have_the_diffusers_layout_and_stay_tiny(self):
        expected = {
            "tiny-sd3": ("StableDiffusion3Pipeline", 3),
            "tiny-flux": ("FluxPipeline", 2),
        }
        for name, (pipeline_class, encoders) in expected.items():
            with self.subTest(name=name):
                folder = ensure_builtin_model(name)
                index = json.loads((folder / "model_index.json").read_text())
                self.assertEqual(index["_class_name"], pipeline_class)
                suffixes = ["", "_2", "_3"][:encoders]
                subfolders = {"transformer", "vae", "scheduler"} | {
                    f"{kind}{s}" for kind in ("text_encoder", "tokenizer") for s in suffixes}
                self.assertEqual({p.name for p in folder.iterdir() if p.is_dir()}, subfolders)
                size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
                self.assertLess(size, 5 * 2**20)

    def test_t5_tokenizer_loads_offline_and_ends_with_eos(self):
        tokenizer = T5Tokenizer.from_pretrained(ensure_builtin_model("tiny-flux") / "tokenizer_2")
        ids = tokenizer(["a red circle", "ü"], padding="max_length", max_length=20).input_ids
        self.assertEqual(len(ids[0]), 20)
        first = ids[0][:ids[0].index(tokenizer.eos_token_id)]
        self.assertEqual(len(first), len("a red circle") - 2)  # one piece per character
        self.assertIn(tokenizer.unk_token_id, ids[1])


class FlowFolderMismatchTest(FlowCase):
    def assert_refused(self, family: str, builtin: str, *fragments: str):
        with self.assertRaises(ModelFolderError) as caught:
            get_adapter_class(family).load(ensure_builtin_model(builtin), device=CPU,
                                           weight_dtype=torch.float32,
                                           loss_settings=LossSettings())
        for fragment in fragments:
            self.assertIn(fragment, str(caught.exception))

    def test_flow_family_on_a_unet_folder(self):
        self.assert_refused("sd3", "tiny-sdxl", "not a sd3 model folder", "missing transformer/",
                            "has unet/", "says it is sdxl")
        self.assert_refused("flux", "tiny-sd1x", "not a flux model folder", "has unet/",
                            "sd1x or sd2x")

    def test_unet_family_on_a_flow_folder(self):
        self.assert_refused("sdxl", "tiny-flux", "missing unet/", "has transformer/",
                            "says it is flux")
        self.assert_refused("sd1x", "tiny-sd3", "has text_encoder_2/, transformer/")

    def test_sd3_and_flux_folders_are_told_apart(self):
        self.assert_refused("flux", "tiny-sd3", "has text_encoder_3/", "says it is sd3")
        self.assert_refused("sd3", "tiny-flux", "missing text_encoder_3/, tokenizer_3/",
                            "says it is flux")


if __name__ == "__main__":
    unittest.main()
