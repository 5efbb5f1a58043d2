"""What a run has done so far: the one state a checkpoint saves for the trainer itself (the
weights, optimizer, schedule and sampler position are saved beside it by the checkpointer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
