"""SimpleTuner's loss_type (l2, huber, smooth_l1) with huber_schedule and huber_c: the loss on
known tensors, the scheduled threshold, and the families' training loss using them."""

from __future__ import annotations

import math
import unittest

import torch

from simpletuner.models.loss_types import (ddpm_noise_ratio, flow_noise_ratio, huber_thresholds,
                                           objective_loss)
from model_fixtures import TinyModelCase, random_batch


class PseudoHuberTest(unittest.TestCase):
    def test_huber_and_smooth_l1_on_known_values(self):
        prediction = torch.tensor([[3.0, 0.0], [1.0, -2.0]])
        target = torch.zeros(2, 2)
        c = torch.tensor([0.5, 2.0])
        # By hand: sample 0 has d = 3, 0 at c = 0.5; sample 1 has d = 1, -2 at c = 2.
        s0 = [math.sqrt(9 + 0.25) - 0.5, 0.0]
        s1 = [math.sqrt(1 + 4) - 2, math.sqrt(4 + 4) - 2]
        huber = (2 * 0.5 * sum(s0) / 2 + 2 * 2.0 * sum(s1) / 2) / 2
        smooth = (2 * sum(s0) / 2 + 2 * sum(s1) / 2) / 2
        self.assertAlmostEqual(objective_loss(prediction, target, loss_type="huber",
                                              thresholds=c).item(), huber, places=5)
        self.assertAlmostEqual(objective_loss(prediction, target, loss_type="smooth_l1",
                                              thresholds=c).item(), smooth, places=5)
        weights = torch.tensor([1.0, 0.0])
        self.assertAlmostEqual(objective_loss(prediction, target, loss_type="huber",
                                              thresholds=c, weights=weights).item(),
                               2 * 0.5 * sum(s0) / 2 / 2, places=5)

    def test_l2_is_the_mean_squared_error(self):
        prediction, target = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])
        self.assertAlmostEqual(objective_loss(prediction, target, loss_type="l2").item(), 2.5)

    def test_schedules_of_the_threshold(self):
        t = torch.tensor([0, 500, 1000])
        constant = huber_thresholds("constant", 0.1, timesteps=t, num_train_timesteps=1000,
                                    noise_ratio=torch.zeros(3))
        self.assertTrue(torch.allclose(constant, torch.full((3,), 0.1)), constant)
        exponential = huber_thresholds("exponential", 0.1, timesteps=t, num_train_timesteps=1000,
                                       noise_ratio=torch.zeros(3))
        for got, want in zip(exponential.tolist(), [1.0, math.sqrt(0.1), 0.1]):
            self.assertAlmostEqual(got, want, places=6)
        ratio = torch.tensor([0.0, 1.0, 3.0])
        snr = huber_thresholds("snr", 0.1, timesteps=t, num_train_timesteps=1000,
                               noise_ratio=ratio)
        for got, r in zip(snr.tolist(), [0.0, 1.0, 3.0]):
            self.assertAlmostEqual(got, 0.9 / (1 + r) ** 2 + 0.1, places=6)

    def test_noise_ratios(self):
        alphas = torch.tensor([0.8, 0.5, 0.2])
        self.assertAlmostEqual(ddpm_noise_ratio(alphas, torch.tensor([2])).item(), 2.0, places=5)
        self.assertAlmostEqual(flow_noise_ratio(torch.tensor([0.5])).item(),
                               math.sqrt(0.5 / 0.5001), places=6)


class FamilyLossTest(TinyModelCase):
    """The same draws under each loss_type, so the relations between the pseudo-Huber losses
    and l2 show each family computes the chosen one: huber = c * smooth_l1 at a constant c, and
    2c(sqrt(d^2 + c^2) - c) lies just below d^2 when |d| is small against c."""

    def losses(self, family: str) -> dict[str, float]:
        values, batch = {}, None
        for loss_type in ("l2", "huber", "smooth_l1"):
            adapter = self.load(family, loss_type=loss_type, huber_schedule="constant",
                                huber_c=10.0)
            batch = batch or random_batch(adapter, 2)  # the VAE samples: encode once
            values[loss_type] = adapter.compute_loss(
                batch, torch.Generator().manual_seed(3)).item()
        return values

    def test_unet_and_flow_families_train_with_the_chosen_loss(self):
        for family in ("sd1x", "sd3"):
            with self.subTest(family=family):
                values = self.losses(family)
                self.assertAlmostEqual(values["huber"], 10 * values["smooth_l1"],
                                       delta=1e-5 * values["huber"])
                self.assertLess(values["huber"], values["l2"])
                self.assertGreater(values["huber"], 0.95 * values["l2"])

    def test_the_snr_schedule_changes_the_loss(self):
        adapter = self.load("sd1x", loss_type="huber", huber_schedule="snr", huber_c=0.1)
        constant = self.load("sd1x", loss_type="huber", huber_schedule="constant", huber_c=0.1)
        batch = random_batch(adapter, 2)
        scheduled = adapter.compute_loss(batch, torch.Generator().manual_seed(3)).item()
        fixed = constant.compute_loss(batch, torch.Generator().manual_seed(3)).item()
        self.assertNotAlmostEqual(scheduled, fixed, places=4)


if __name__ == "__main__":
    unittest.main()
