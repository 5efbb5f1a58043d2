"""In-process training for the optimizer and quantization tests: a config-like namespace with
the memory options, a few optimizer steps on a fixed batch, and the checkpoint round trip
through the trainer's own pickle-free files (checkpointing/tensor_state.py)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from simpletuner.configuration import TrainingConfig
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.settings import OptimizerSettings
from settings_fixtures import training_config
from simpletuner.training.checkpointing.tensor_state import (load_optimizer, load_weights, save_optimizer,
                                              save_weights)


def memory_settings(**overrides) -> TrainingConfig:
    """A real TrainingConfig for the optimizer and precision settings these tests build."""
    values = dict(optimizer="adamw", optimizer_config=None, learning_rate=1e-3, adam_beta1=0.9,
                  adam_beta2=0.999, adam_weight_decay=1e-2, adam_epsilon=1e-8,
                  mixed_precision="no", model_type="lora", model_family="sd1x",
                  base_model_precision="no_change", text_encoder_1_precision="no_change",
                  text_encoder_2_precision="no_change", text_encoder_3_precision="no_change")
    values.update(overrides)
    return training_config(**values)


def autocast_for(settings):
    """bf16 autocast when the settings ask for it (bf16 weights meet float32 latents)."""
    if settings.mixed_precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def evaluation_loss(adapter, batch, settings) -> float:
    """Summed loss over four fixed generators: the same number for the same weights."""
    with torch.no_grad(), autocast_for(settings):
        return sum(adapter.compute_loss(batch, torch.Generator().manual_seed(seed)).item()
                   for seed in range(4))


def train_steps(adapter, optimizer, batch, settings, steps: range) -> None:
    """One optimizer step per entry of ``steps``, its noise drawn from the step number, so a
    resumed run draws what the uninterrupted one drew."""
    for step in steps:
        with autocast_for(settings):
            loss = adapter.compute_loss(batch, torch.Generator().manual_seed(100 + step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def save_training(adapter, optimizer, folder: Path, lora: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_weights(adapter.trainable, folder, lora)
    save_optimizer(optimizer, folder)


def resume_training(adapter, settings, folder: Path, lora: bool):
    """The optimizer of a fresh run over ``adapter``, both loaded from ``folder``."""
    optimizer = build_optimizer(adapter.trainable, OptimizerSettings.from_config(settings))
    load_weights(adapter.trainable, folder, lora)
    load_optimizer(optimizer, folder)
    return optimizer


def trained_tensors(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in network.named_parameters() if p.requires_grad}


def largest_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max((first[k].float() - second[k].float()).abs().max().item() for k in first)


class TinyDenoiser:
    """For torchao's AdamW8bit, which compiles its step once per parameter shape (minutes for
    a UNet's many shapes on two CPU cores): two shapes, and a 64x64 weight, large enough for
    8-bit states. Same calls as a ModelAdapter: trainable, compute_loss(batch, generator)."""

    def __init__(self):
        torch.manual_seed(0)
        self.trainable = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                             torch.nn.Linear(64, 64))

    def compute_loss(self, batch, generator):
        noise = torch.randn(batch.shape, generator=generator)
        return (self.trainable(batch + 0.3 * noise) - batch).pow(2).mean()
