"""Where a run is: what it has done so far (the one state a checkpoint saves for the trainer
itself; the weights, optimizer, schedule and sampler position are saved beside it by the
checkpointer), how long it is, and the noise each of its micro-batches draws."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from simpletuner.helpers.metadata.permutation import stable_seed


@dataclass
class RunState:
    step: int                  # optimizer steps completed (skipped non-finite steps included)
    epoch: int                 # the sampler's epoch when saved
    seed: int                  # the resolved shared seed, so the run can be reproduced
    fingerprint: dict[str, Any]  # what decides the sampler's plan (see the sampler)
    model_type: str            # "full" or "lora": resuming one into the other is refused
    final_loss: float | None = None  # mean loss of the last applied step: always finite
    # The current run of consecutive non-finite steps, so a resumed run diverges when the
    # uninterrupted one would. Checkpoints written before these two fields use the defaults.
    nonfinite_steps: list[int] = field(default_factory=list)


def noise_generator(seed: int, group: int, epoch: int, step: int) -> torch.Generator:
    """Noise and timesteps of a micro-batch depend only on where it is in the run, so a
    resumed run draws exactly what the uninterrupted one drew. ``group``: the rank's
    data-parallel group (its rank without context parallel), so the ranks of one
    context-parallel group draw the same noise for their one micro-batch."""
    return torch.Generator(device="cpu").manual_seed(
        stable_seed("noise", seed, group, epoch, step) & (2**63 - 1))


def total_steps(training, sampler) -> int:
    """max_train_steps, else the optimizer steps of num_train_epochs epochs (bucket_tail carry
    makes an epoch's count depend on the epoch)."""
    steps = training.max_train_steps
    if steps is None:
        steps = sum(sampler.micro_batches_in(epoch) // sampler.accumulation
                    for epoch in range(training.num_train_epochs))
    sampler.timeline.check_every_dataset_joins(steps)
    return steps
