"""Checkpoint tensors without pickles: optimizer state and RNG states survive the round trip."""

from __future__ import annotations

import random
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch

from simpletuner.training.checkpointing.tensor_state import (capture_rng, load_optimizer, load_weights,
                                              restore_rng, save_optimizer, save_weights)


def trained_model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95),
                                  weight_decay=0.1)
    for _ in range(3):
        loss = model(torch.randn(5, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def step(model, optimizer, data):
    model(data).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


class TrainStateTest(unittest.TestCase):
    def test_restored_optimizer_takes_the_same_next_step(self):
        model, optimizer = trained_model_and_optimizer(0)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            save_weights(model, folder, lora=False)
            save_optimizer(optimizer, folder)
            self.assertFalse([p for p in folder.iterdir()
                              if p.suffix not in (".safetensors", ".json")])
            other, other_optimizer = trained_model_and_optimizer(1)  # different state
            load_weights(other, folder, lora=False)
            load_optimizer(other_optimizer, folder)
        data = torch.randn(5, 4)
        expected = step(model, optimizer, data)
        restored = step(other, other_optimizer, data)
        for a, b in zip(expected, restored):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(other_optimizer.param_groups[0]["betas"], (0.8, 0.95))

    def test_rng_states_round_trip(self):
        random.seed(1), np.random.seed(2), torch.manual_seed(3)
        state = capture_rng()
        expected = (random.random(), np.random.rand(), torch.rand(1).item())
        random.seed(9), np.random.seed(9), torch.manual_seed(9)
        restore_rng(state)
        self.assertEqual((random.random(), np.random.rand(), torch.rand(1).item()), expected)


if __name__ == "__main__":
    unittest.main()
