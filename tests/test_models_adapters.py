"""Model family adapters: they learn, follow their objective, and refuse the wrong folder."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import CPU, TinyModelCase, losses_around_training, random_batch
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.noise_objective import draw_noise, min_snr_weights
from simpletuner.models.registry import get_adapter_class

FAMILIES = ("sd1x", "sd2x", "sdxl")


class AdapterCase(TinyModelCase):
    def fixed_batch(self, adapter, sizes=((64, 64), (64, 64), (64, 64), (64, 64))):
        """64x64 images; ``sizes`` are their original sizes (SDXL micro-conditioning)."""
        return random_batch(adapter, len(sizes), original_sizes=sizes)


class LossFallsTest(AdapterCase):
    def test_loss_on_a_fixed_batch_falls_with_adamw(self):
        for family in FAMILIES:
            with self.subTest(family=family):
                torch.manual_seed(0)
                adapter = self.load(family, snr_gamma=5.0)
                before, after = losses_around_training(adapter, self.fixed_batch(adapter),
                                                       lr=1e-3, steps=20)
                self.assertLess(after, 0.6 * before, f"{family}: {before} -> {after}")


class ObjectiveTest(AdapterCase):
    def test_same_generator_same_loss_other_generator_other_loss(self):
        adapter = self.load("sd1x")
        batch = self.fixed_batch(adapter)
        with torch.no_grad():
            first = adapter.compute_loss(batch, torch.Generator().manual_seed(3))
            again = adapter.compute_loss(batch, torch.Generator().manual_seed(3))
            other = adapter.compute_loss(batch, torch.Generator().manual_seed(4))
        self.assertEqual(first.item(), again.item())
        self.assertNotEqual(first.item(), other.item())

    def test_target_is_epsilon_or_velocity_from_the_scheduler(self):
        """A network that predicts zeros makes the loss the mean square of the target, which
        the DDPM forward process determines from the noisy input and the clean latents."""
        for family, velocity in (("sd1x", False), ("sd2x", True)):
            with self.subTest(family=family):
                adapter = self.load(family)
                batch = self.fixed_batch(adapter)
                seen = {}

                def zero_network(sample, timestep, **conditioning):
                    seen.update(sample=sample, timestep=timestep)
                    return (torch.zeros_like(sample),)

                loss = adapter.compute_loss(batch, torch.Generator().manual_seed(5),
                                            network=zero_network)
                abar = adapter.noise_scheduler.alphas_cumprod[seen["timestep"]]
                abar = abar.view(-1, 1, 1, 1)
                clean = batch.latents.float()
                noise = (seen["sample"] - abar.sqrt() * clean) / (1 - abar).sqrt()
                target = abar.sqrt() * noise - (1 - abar).sqrt() * clean if velocity else noise
                self.assertAlmostEqual(loss.item(), target.pow(2).mean().item(), places=4)

    def test_min_snr_weights(self):
        alphas_cumprod = torch.tensor([0.5, 0.9])  # SNR 1 and 9
        timesteps = torch.tensor([0, 1])
        epsilon = min_snr_weights(alphas_cumprod, timesteps, 5.0, "epsilon")
        velocity = min_snr_weights(alphas_cumprod, timesteps, 5.0, "v_prediction")
        self.assertTrue(torch.allclose(epsilon, torch.tensor([1.0, 5.0 / 9.0])))
        self.assertTrue(torch.allclose(velocity, torch.tensor([0.5, 5.0 / 10.0])))

    def test_noise_offset_shifts_each_channel(self):
        shape = torch.Size((64, 4, 8, 8))
        plain = draw_noise(shape, device=CPU, generator=torch.Generator().manual_seed(0))
        offset = draw_noise(shape, device=CPU, generator=torch.Generator().manual_seed(0),
                            noise_offset=1.0)
        # Per-channel means: std 1/8 for plain noise, about sqrt(1 + 1/64) with the offset.
        self.assertLess(plain.mean(dim=(2, 3)).std().item(), 0.2)
        self.assertGreater(offset.mean(dim=(2, 3)).std().item(), 0.7)

    def test_gradient_checkpointing_switch_keeps_gradients(self):
        adapter = self.load("sd1x")
        batch = self.fixed_batch(adapter)
        grads = []
        for enabled in (False, True):
            adapter.set_gradient_checkpointing(enabled)
            self.assertEqual(adapter.trainable.is_gradient_checkpointing, enabled)
            adapter.compute_loss(batch, torch.Generator().manual_seed(1)).backward()
            grads.append(torch.cat([p.grad.flatten() for p in adapter.trainable.parameters()]))
            adapter.trainable.zero_grad()
        self.assertTrue(torch.allclose(grads[0], grads[1], atol=1e-6))


class SDXLConditioningTest(AdapterCase):
    def test_add_time_ids_come_from_each_samples_metadata(self):
        adapter = self.load("sdxl")
        batch = self.fixed_batch(adapter, sizes=((64, 64), (64, 64)))
        batch.original_sizes = [(300, 200), (1024, 768)]
        batch.crop_top_lefts = [(5, 0), (0, 17)]
        batch.target_sizes = [(64, 64), (64, 128)]
        captured = {}

        def capture(module, args, kwargs):
            captured.update(kwargs["added_cond_kwargs"])

        handle = adapter.trainable.register_forward_pre_hook(capture, with_kwargs=True)
        try:
            adapter.compute_loss(batch, torch.Generator().manual_seed(0))
        finally:
            handle.remove()
        expected = torch.tensor([[300, 200, 5, 0, 64, 64], [1024, 768, 0, 17, 64, 128]],
                                dtype=torch.float32)
        self.assertTrue(torch.equal(captured["time_ids"], expected))
        self.assertTrue(torch.equal(captured["text_embeds"],
                                    batch.prompt_embeds["pooled_prompt_embeds"]))

    def test_prompt_embeddings_have_both_encoders(self):
        adapter = self.load("sdxl")
        embeds = adapter.encode_prompts(["a", "b", "c"])
        self.assertEqual(set(embeds), {"prompt_embeds", "pooled_prompt_embeds"})
        width = sum(encoder.config.hidden_size for encoder in adapter.text_encoders)
        self.assertEqual(embeds["prompt_embeds"].shape, (3, 77, width))
        self.assertEqual(embeds["pooled_prompt_embeds"].shape[0], 3)

    def test_missing_geometry_is_a_clear_error(self):
        adapter = self.load("sdxl")
        batch = self.fixed_batch(adapter, sizes=((64, 64), (64, 64)))
        batch.crop_top_lefts = [(0, 0)]
        with self.assertRaisesRegex(ValueError, "1 crops"):
            adapter.compute_loss(batch)


class FolderMismatchTest(AdapterCase):
    def assert_refused(self, family: str, folder: Path, *fragments: str):
        with self.assertRaises(ModelFolderError) as caught:
            get_adapter_class(family).load(folder, device=CPU, weight_dtype=torch.float32,
                                           loss_settings=LossSettings())
        for fragment in fragments:
            self.assertIn(fragment, str(caught.exception))

    def test_sdxl_folder_given_as_sd1x(self):
        self.assert_refused("sd1x", ensure_builtin_model("tiny-sdxl"),
                            "not a sd1x model folder", "text_encoder_2/",
                            "set model_family to match", "sdxl")

    def test_sd1x_folder_given_as_sdxl(self):
        self.assert_refused("sdxl", ensure_builtin_model("tiny-sd1x"),
                            "not a sdxl model folder", "missing text_encoder_2/, tokenizer_2/")

    def test_folder_without_unet(self):
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch) / "model"
            shutil.copytree(ensure_builtin_model("tiny-sd2x"), folder)
            shutil.rmtree(folder / "unet")
            self.assert_refused("sd2x", folder, "missing unet/", "expects a diffusers folder")

    def test_unknown_family(self):
        with self.assertRaisesRegex(ValueError, "known: .*sd1x, sd2x, sd3, sdxl"):
            get_adapter_class("sd4")


if __name__ == "__main__":
    unittest.main()
