"""Every optimizer that runs on this machine trains a tiny network, checkpoints through the
trainer's pickle-free files and resumes exactly: the resumed run ends with the uninterrupted
run's weights, bit for bit, and its optimizer state has the same kinds of values (bf16 and
Kahan states, torchao's 8-bit state tensors, Prodigy's plain numbers)."""

from __future__ import annotations

import json
import tempfile
import unittest
from functools import partial
from pathlib import Path

import torch

from simpletuner.training.optimization.optimizers import build_optimizer, parse_optimizer_config
from simpletuner.training.settings import OptimizerSettings
from simpletuner.training.checkpointing.tensor_state import OPTIMIZER_TENSORS, OPTIMIZER_VALUES

from lean_fixtures import (TinyDenoiser, evaluation_loss, largest_difference, memory_settings,
                           resume_training, save_training, train_steps, trained_tensors)
from model_fixtures import TinyModelCase, random_batch

# Learning rates at each optimizer's usual scale (Prodigy estimates its own step size).
UNET_OPTIMIZERS = {
    "adamw": dict(learning_rate=1e-3),
    "adamw_bf16": dict(learning_rate=1e-3, mixed_precision="bf16"),
    "prodigy": dict(learning_rate=1.0),
    "adafactor": dict(learning_rate=1e-2),
    "lion": dict(learning_rate=1e-4),
}
AO_8BIT = dict(optimizer="ao-adamw8bit", learning_rate=1e-3, model_type="full")


def state_kinds(optimizer) -> list[tuple]:
    """(parameter number, state name, value type, dtype) of every state value."""
    kinds = []
    for number, entries in optimizer.state_dict()["state"].items():
        for name, value in entries.items():
            kinds.append((number, name, type(value).__name__, getattr(value, "dtype", None)))
    return sorted(kinds, key=str)


def comparable(value):
    """A state value as plain tensors (a quantized state by its inner tensors)."""
    if hasattr(value, "__tensor_flatten__") and type(value) is not torch.Tensor:
        parts, _ = value.__tensor_flatten__()
        return [getattr(value, part) for part in parts]
    return [value]


class ResumeCase(TinyModelCase):
    def check_optimizer(self, make_model, batch, settings):
        """Train 3 steps, checkpoint, train 3 more; a fresh model resumed from the checkpoint
        and trained the same 3 steps ends with the same weights and optimizer state."""
        model = make_model()
        optimizer = build_optimizer(model.trainable, OptimizerSettings.from_config(settings))
        expected_dtype = torch.bfloat16 if settings.optimizer == "adamw_bf16" else torch.float32
        self.assertEqual({p.dtype for p in model.trainable.parameters()}, {expected_dtype})
        before = evaluation_loss(model, batch, settings)
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        train_steps(model, optimizer, batch, settings, range(3))
        save_training(model, optimizer, folder, lora=False)
        train_steps(model, optimizer, batch, settings, range(3, 6))
        self.assertLess(evaluation_loss(model, batch, settings), before)
        json.loads((folder / OPTIMIZER_VALUES).read_text())  # plain JSON, no pickle
        self.assertTrue((folder / OPTIMIZER_TENSORS).is_file())

        resumed = make_model()
        resumed_optimizer = resume_training(resumed, settings, folder, lora=False)
        self.assertEqual(state_kinds(resumed_optimizer), state_kinds(optimizer))
        train_steps(resumed, resumed_optimizer, batch, settings, range(3, 6))
        self.assertEqual(largest_difference(trained_tensors(model.trainable),
                                            trained_tensors(resumed.trainable)), 0.0)
        self.assert_same_state(optimizer, resumed_optimizer)
        return optimizer

    def assert_same_state(self, first, second):
        one, other = first.state_dict(), second.state_dict()
        for number, entries in one["state"].items():
            for name, value in entries.items():
                for a, b in zip(comparable(value), comparable(other["state"][number][name]),
                                strict=True):
                    same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                    self.assertTrue(same, f"state {number}/{name} differs after resume")


class UNetOptimizerResumeTest(ResumeCase):
    """Full fine-tuning of the tiny SD 1.x UNet with each optimizer but torchao's."""

    def test_each_optimizer_trains_and_resumes_exactly(self):
        make_model = partial(self.load, "sd1x")
        batch = random_batch(make_model(), 2)
        for name, options in UNET_OPTIMIZERS.items():
            with self.subTest(optimizer=name):
                optimizer = self.check_optimizer(make_model, batch, memory_settings(
                    optimizer=name, model_type="full", **options))
                if name == "adamw_bf16":  # bf16 states plus the Kahan compensation
                    self.assertIn(("kahan_comp", torch.bfloat16),
                                  {(n, d) for _, n, _, d in state_kinds(optimizer)})


class TorchaoOptimizerResumeTest(ResumeCase):
    def test_8bit_states_train_and_resume_exactly(self):
        batch = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
        optimizer = self.check_optimizer(TinyDenoiser, batch, memory_settings(**AO_8BIT))
        self.assertIn(("exp_avg", "OptimState8bit"),
                      {(n, t) for _, n, t, _ in state_kinds(optimizer)})


class OptimizerConfigTest(unittest.TestCase):
    def test_values_are_read_as_json_and_reach_the_optimizer(self):
        self.assertEqual(parse_optimizer_config("weight_decay=0.5,betas=[0.8, 0.9],amsgrad=True"),
                         {"weight_decay": 0.5, "betas": [0.8, 0.9], "amsgrad": True})
        network = torch.nn.Linear(4, 4)
        optimizer = build_optimizer(network, OptimizerSettings.from_config(memory_settings(
            optimizer_config="weight_decay=0.5,betas=[0.8,0.9]")))
        group = optimizer.param_groups[0]
        self.assertEqual((group["weight_decay"], tuple(group["betas"])), (0.5, (0.8, 0.9)))

    def test_an_item_without_a_value_is_refused(self):
        with self.assertRaises(ValueError):
            parse_optimizer_config("weight_decay")


if __name__ == "__main__":
    unittest.main()
