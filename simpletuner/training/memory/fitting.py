"""Will the run fit on one device: the memory model's bytes (model.py) with the activations of
one micro-batch (activations.py), block swap's host blocks taken off the device and its staged
copies put on, and, given the device's memory (``plan --memory --gpu-memory``), the first
settings that would make it fit, tried in this order: the VAE and text encoders off the device
after caching, gradient checkpointing, then more and more blocks swapped."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from simpletuner.training.memory.activations import ActivationBytes
from simpletuner.training.memory.model import RankBytes, rank_bytes
from simpletuner.training.memory.shards import WHOLE


@dataclass(frozen=True)
class BlockCosts:
    """Per swappable block, in forward order: its parameters' device bytes, and its
    gradients', optimizer state's and EMA's."""

    weights: tuple[int, ...]
    training: tuple[int, ...]

    @classmethod
    def of(cls, blocks: list[torch.nn.Module], training) -> "BlockCosts":
        held = [rank_bytes(block, training, WHOLE, {}) for block in blocks]
        return cls(tuple(sum(h.trainable.values()) + sum(h.frozen.values()) for h in held),
                   tuple(h.gradients + h.optimizer + h.ema for h in held))


@dataclass(frozen=True)
class Setting:
    """The settings fitting may change, as config.json names them."""

    frozen_components_after_caching: str
    gradient_checkpointing: bool
    musubi_blocks_to_swap: int

    @classmethod
    def of(cls, training) -> "Setting":
        return cls(training.frozen_components_after_caching, training.gradient_checkpointing,
                   training.musubi_blocks_to_swap)


@dataclass(frozen=True)
class DevicePeak:
    while_caching: int
    while_training: int
    activations: int
    on_host: int      # block swap's blocks: weights, gradients, optimizer state, EMA
    staged: int       # device copies of the running and the prefetched host block

    @property
    def peak(self) -> int:
        return max(self.while_caching, self.while_training)


def device_peak(held: RankBytes, activations: ActivationBytes, costs: BlockCosts,
                setting: Setting) -> DevicePeak:
    count = setting.musubi_blocks_to_swap
    host_weights = sum(costs.weights[len(costs.weights) - count:]) if count else 0
    host_training = sum(costs.training[len(costs.training) - count:]) if count else 0
    staged = sum(sorted(costs.weights[len(costs.weights) - count:])[-2:]) if count else 0
    held = replace(held, components_stay=held.components_stay  # never under group offload
                   and setting.frozen_components_after_caching == "keep")
    held_activations = activations.held(setting.gradient_checkpointing)
    return DevicePeak(
        while_caching=held.while_caching - host_weights,
        while_training=(held.while_training - host_weights - host_training + staged
                        + held_activations),
        activations=held_activations, on_host=host_weights + host_training, staged=staged)


def _candidates(setting: Setting, blocks: int):
    """Settings to try, each one step further than the last."""
    if setting.frozen_components_after_caching == "keep":
        setting = replace(setting, frozen_components_after_caching="offload")
        yield setting
    if not setting.gradient_checkpointing:
        setting = replace(setting, gradient_checkpointing=True)
        yield setting
    for count in range(setting.musubi_blocks_to_swap + 1, blocks + 1):
        yield replace(setting, musubi_blocks_to_swap=count)


def fitting_setting(held: RankBytes, activations: ActivationBytes, costs: BlockCosts,
                    training, budget: int) -> tuple[Setting, DevicePeak] | None:
    """The first setting (from the config's own on) whose peak is within ``budget`` bytes, or
    None when even every block swapped does not fit. Block swap is only tried for one
    process without FSDP2 (where it runs)."""
    setting = Setting.of(training)
    blocks = len(costs.weights) if training.num_processes == 1 and not training.fsdp_enable else 0
    for candidate in (setting, *_candidates(setting, blocks)):
        peak = device_peak(held, activations, costs, candidate)
        if peak.peak <= budget:
            return candidate, peak
    return None


def changes(before: Setting, after: Setting) -> str:
    """The options that differ, as config.json would hold them."""
    parts = [f"{name} {value!r}".replace("True", "true")
             for name, value in vars(after).items() if getattr(before, name) != value]
    return ", ".join(parts)
