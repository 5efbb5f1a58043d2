"""is_regularisation_data: SimpleTuner's prior preservation. A regularisation sample's loss is
the family's objective between the adapted prediction and the base model's prediction (the
adapter turned off) for the same noisy input, weighted like any other sample. Checked against
that formula written here with diffusers' own calls, for a noise-prediction and a flow family."""

from __future__ import annotations

import unittest
from functools import partial

import torch
from diffusers import DDPMScheduler

from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.prior_preservation import adapter_turned_off
from simpletuner.training.adapters.lora import add_lora
from model_fixtures import TinyModelCase, random_batch


def perturb_lora(network: torch.nn.Module, seed: int) -> None:
    """B starts at zero (the adapted network equals the base); give it values."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in network.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


class PriorPreservationTest(TinyModelCase):
    """One class: the tiny models are built once into its cache."""

    def setUp(self):
        self.adapter = self.load("sd1x")
        add_lora(self.adapter.trainable, type(self.adapter), rank=4)
        self.batch = random_batch(self.adapter, 2)
        self.base_model = partial(adapter_turned_off, self.adapter.trainable)

    def by_hand(self, seed: int) -> tuple[float, float]:
        """(regularisation loss, ordinary loss) with the trainer's draws: noise, then timesteps
        from one generator; DDPM's add_noise; the UNet with and without its adapter."""
        unet = self.adapter.trainable
        scheduler = DDPMScheduler.from_pretrained(ensure_builtin_model("tiny-sd1x") / "scheduler")
        latents = self.batch.latents.float()
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn(latents.shape, generator=generator)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (2,),
                                  generator=generator)
        noisy = scheduler.add_noise(latents, noise, timesteps)
        hidden = self.batch.prompt_embeds["prompt_embeds"]
        with torch.no_grad():
            adapted = unet(noisy, timesteps, encoder_hidden_states=hidden).sample
            unet.disable_adapters()
            base = unet(noisy, timesteps, encoder_hidden_states=hidden).sample
            unet.enable_adapters()
        weight = 1.0  # SimpleTuner weighs a regularisation sample like any other
        return (weight * ((adapted - base) ** 2).mean().item(),
                ((adapted - noise) ** 2).mean().item())

    def test_the_target_is_the_base_models_prediction(self):
        perturb_lora(self.adapter.trainable, 1)
        regularisation, ordinary = self.by_hand(3)
        got = self.adapter.compute_loss(self.batch, torch.Generator().manual_seed(3),
                                        base_model=self.base_model)
        self.assertAlmostEqual(got.item(), regularisation, places=5)
        plain = self.adapter.compute_loss(self.batch, torch.Generator().manual_seed(3))
        self.assertAlmostEqual(plain.item(), ordinary, places=5)
        self.assertGreater(regularisation, 0.0)
        self.assertGreater(abs(regularisation - ordinary), 0.1)

    def test_an_unchanged_adapter_has_nothing_to_learn_and_stays_on(self):
        got = self.adapter.compute_loss(self.batch, torch.Generator().manual_seed(4),
                                        base_model=self.base_model)
        self.assertEqual(got.item(), 0.0)  # B = 0: adapted and base predictions are equal
        got.backward()
        grads = [p.grad for n, p in self.adapter.trainable.named_parameters() if p.requires_grad]
        self.assertTrue(grads and all(g is None or not g.any() for g in grads))
        perturb_lora(self.adapter.trainable, 2)
        self.assertGreater(self.adapter.compute_loss(
            self.batch, torch.Generator().manual_seed(4), base_model=self.base_model).item(), 0)
        # the adapter is on again after the base model's prediction
        self.assertGreater(self.by_hand(4)[0], 0.0)

    def test_flow_family_regularisation_loss_is_zero_for_the_base_and_positive_after(self):
        adapter = self.load("sd3")
        add_lora(adapter.trainable, type(adapter), rank=4)
        batch = random_batch(adapter, 2)
        base_model = partial(adapter_turned_off, adapter.trainable)
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(5), base_model=base_model)
        self.assertEqual(loss.item(), 0.0)
        plain = adapter.compute_loss(batch, torch.Generator().manual_seed(5)).item()
        self.assertGreater(plain, 0.01)
        perturb_lora(adapter.trainable, 3)
        self.assertGreater(adapter.compute_loss(batch, torch.Generator().manual_seed(5),
                                                base_model=base_model).item(), 0.0)


if __name__ == "__main__":
    unittest.main()
