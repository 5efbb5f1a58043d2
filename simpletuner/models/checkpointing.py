"""Gradient checkpointing of the trained network's repeated blocks, with SimpleTuner's
``gradient_checkpointing_interval`` n: a block is checkpointed when its index in its own block
list is a multiple of n (Flux: double-stream blocks 0, n, 2n..., then single-stream blocks 0,
n, 2n...); the others keep their activations, so the backward recomputes fewer blocks for more
memory. n = 1 checkpoints every block. The gradients are the same either way.

One mechanism for every family: diffusers' networks hand each block to the checkpointing
function they were given (``enable_gradient_checkpointing``), which ``EveryNthBlock`` is; a
family with its own per-block wrapping (Chroma) asks ``checkpointed`` per block."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def block_positions(network: torch.nn.Module) -> dict[int, int]:
    """id(block) -> its index in the ModuleList that holds it, for every ModuleList item."""
    return {id(block): index for module in network.modules()
            if isinstance(module, torch.nn.ModuleList) for index, block in enumerate(module)}


class EveryNthBlock:
    """diffusers' ``gradient_checkpointing_func``: the blocks at multiples of ``interval`` in
    their list run under torch's (non-reentrant) checkpoint, the others as they are. A module
    in no list is always checkpointed, as without an interval."""

    def __init__(self, network: torch.nn.Module, interval: int):
        if interval < 1:
            raise ValueError(f"gradient_checkpointing_interval must be at least 1, not {interval}")
        self.interval = interval
        self.positions = block_positions(network)

    def checkpointed(self, block: torch.nn.Module) -> bool:
        return self.positions.get(id(block), 0) % self.interval == 0

    def __call__(self, block: torch.nn.Module, *args, **kwargs):
        if self.checkpointed(block):
            return checkpoint(block.__call__, *args, use_reentrant=False, **kwargs)
        return block(*args, **kwargs)
