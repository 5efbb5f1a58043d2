"""TrainedParts for checkpoint tests that need no sampler: a real LR schedule and a position
object standing in for the sampler (the checkpointer only asks it for a JSON state)."""

from __future__ import annotations

import torch

from simpletuner.training.checkpointing.checkpointer import TrainedParts


class Position:
    """The sampler's side of a checkpoint: a JSON state saved and loaded back."""

    def __init__(self, **state):
        self.state = dict(state)

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def parts_for(network: torch.nn.Module, optimizer, *, ema=None, **position) -> TrainedParts:
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return TrainedParts(network, optimizer, schedule, Position(**position), ema)
