"""The optimizer step's one collective and what every rank decides from it.

Each rank packs its accumulated loss, its micro-batch count, whether its loss and gradient norm
were finite, whether it received a stop signal, and the run requests the main rank found
(training/run/requests.py) into one small tensor; one sum-reduce gives every rank the same
totals, so every rank skips, stops, diverges, checkpoints or validates at the same step. The loss
stays on the device until then: one host read per optimizer step, none per micro-batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from simpletuner.common.peer_watch import in_collective
from simpletuner.training.run.outcomes import Diverged

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepTotals:
    """One rank's values, or (after the reduce) their sums over all ranks."""

    loss_sum: float
    micro_batches: float
    nonfinite_loss: float   # ranks whose loss was NaN/inf
    nonfinite_grad: float   # ranks whose gradient norm was NaN/inf
    stopping: float         # ranks that received a stop signal
    checkpoint_asked: float = 0.0  # a checkpoint requested from outside (the main rank's look)
    validation_asked: float = 0.0  # a validation requested from outside

    @property
    def finite(self) -> bool:
        return self.nonfinite_loss == 0 and self.nonfinite_grad == 0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.micro_batches


def clip_gradients(accelerator, parameters: Iterable[torch.Tensor], max_grad_norm: float,
                   method: str) -> torch.Tensor:
    """The total gradient norm before clipping. Unless ``max_grad_norm`` is 0, ``norm`` scales
    the gradients to that total norm, ``value`` clamps each element to +-max_grad_norm.
    Through accelerate, so fp16 gradients are unscaled and sharded ones measured whole."""
    parameters = list(parameters)
    by_norm = method == "norm" and max_grad_norm
    norm = accelerator.clip_grad_norm_(parameters, max_grad_norm if by_norm else math.inf)
    if method == "value" and max_grad_norm:
        # accelerate unscaled fp16 gradients above; its clip_grad_value_ would unscale again.
        torch.nn.utils.clip_grad_value_(parameters, max_grad_norm)
    # With FSDP2 the norm of sharded gradients is a DTensor whose local value is partial.
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def pack_step(loss_sum: torch.Tensor, micro_batches: int, grad_norm: torch.Tensor,
              stopping: bool, asked: tuple[bool, bool] = (False, False)) -> torch.Tensor:
    """This rank's part of the reduce, in StepTotals' field order, built without a host sync.
    ``asked``: (checkpoint, validation) requested from outside."""
    loss_sum = loss_sum.detach().float().reshape(())
    grad_norm = grad_norm.detach().float().reshape(()).to(loss_sum.device)
    flags = torch.tensor([float(stopping), *map(float, asked)], device=loss_sum.device)
    return torch.cat([torch.stack([loss_sum, torch.full_like(loss_sum, micro_batches),
                                   (~torch.isfinite(loss_sum)).float(),
                                   (~torch.isfinite(grad_norm)).float()]), flags])


def reduce_step(accelerator, packed: torch.Tensor) -> tuple[StepTotals, StepTotals]:
    """The step's one collective: (this rank's values, the sums over every rank)."""
    total = accelerator.reduce(packed, reduction="sum")
    local_values, total_values = torch.stack([packed, total]).tolist()
    return StepTotals(*local_values), StepTotals(*total_values)


def stop_requested_anywhere(accelerator, requested: bool) -> bool:
    """Outside a step (after the last one): whether any rank received a stop signal."""
    flag = torch.tensor(float(requested), device=accelerator.device)
    with in_collective("the stop check after the last step"):
        return accelerator.reduce(flag, reduction="sum").item() > 0


class NonFiniteGuard:
    """Decides, from the reduced totals, whether a step is applied, and counts the run of
    consecutive non-finite steps. Every rank holds one and feeds it the same totals.

    With an fp16 loss scaler, an overflowing gradient with a finite loss is the scaler's normal
    search for its scale (``loss_scaled``): that step is skipped but not counted."""

    def __init__(self, max_consecutive: int, *, loss_scaled: bool = False,
                 bad_steps: list[int] | None = None):
        self.max_consecutive = max_consecutive
        self.loss_scaled = loss_scaled
        # The current run of consecutive non-finite steps (a resumed run's, from its state).
        self.bad_steps: list[int] = list(bad_steps or [])

    def should_apply(self, totals: StepTotals, step: int) -> bool:
        if totals.finite:
            self.bad_steps.clear()
            return True
        if not (self.loss_scaled and totals.nonfinite_loss == 0):
            self.bad_steps.append(step)
        return False

    @property
    def diverged(self) -> bool:
        return len(self.bad_steps) >= self.max_consecutive


def nonfinite_warning(totals: StepTotals, local: StepTotals, *, step: int, epoch: int,
                      world: int, consecutive: int, limit: int, samples: list[str]) -> str:
    """One rank's warning for a skipped step: what was non-finite where, and its own samples."""
    mine = "non-finite" if not local.finite else "finite"
    return (f"step {step} (epoch {epoch}) skipped on every rank: loss non-finite on "
            f"{totals.nonfinite_loss:.0f} of {world} rank(s), gradient norm non-finite on "
            f"{totals.nonfinite_grad:.0f}; {consecutive} such step(s) in a row "
            f"(max_nonfinite_steps {limit}); this rank ({mine}) trained on: {', '.join(samples)}")


def diverged_error(bad_steps: list[int], training, *, at_the_end: bool = False) -> Diverged:
    """The run's end as diverged, with advice fitting the cause: a streak from step 1 means the
    starting weights or the data give NaN/inf (no learning rate helps); a streak after a finite
    step, that step's update blew the weights up. ``at_the_end``: the run reached its last step
    inside a streak shorter than max_nonfinite_steps, so the guard never stopped it."""
    steps = ", ".join(str(s) for s in bad_steps)
    if at_the_end:
        what = (f"the run ended in {len(bad_steps)} non-finite step(s) in a row (steps {steps}; "
                f"max_nonfinite_steps {training.max_nonfinite_steps}), so its weights are not "
                "exported as trained")
    else:
        what = (f"loss or gradient norm was NaN/inf at steps {steps} ({len(bad_steps)} in a "
                f"row, max_nonfinite_steps {training.max_nonfinite_steps})")
    if bad_steps[0] == 1:
        return Diverged(
            f"training diverged: {what}. No step was finite: the starting weights or the data "
            "already give NaN/inf, before any update, so a lower learning rate would not help. "
            "Check the weights the run starts from (pretrained_model_name_or_path, init_lora, "
            "resume_from_checkpoint)" + (" and mixed_precision 'bf16' or 'no' (fp16 overflows "
                                         "easily)" if training.mixed_precision == "fp16" else "")
            + "; nothing non-finite was saved.")
    fixes = [f"a lower learning_rate (now {training.learning_rate:g})",
             "max_grad_norm 1.0 (now 0: no clipping)" if training.max_grad_norm == 0 else
             f"a lower max_grad_norm (now {training.max_grad_norm:g})"]
    if training.mixed_precision == "fp16":
        fixes.append("mixed_precision 'bf16' or 'no' (fp16 overflows easily)")
    return Diverged(
        f"training diverged: {what}. The last finite step was step {bad_steps[0] - 1}, and the "
        "weights its update left give NaN/inf. Those steps were skipped and nothing non-finite "
        "was saved, but checkpoints written from that step on hold the weights that led here. "
        f"Try {', or '.join(fixes)}.")


def back_off_loss_scale(accelerator) -> None:
    """For a skipped step: an fp16 loss scaler still lowers its scale after an overflow (its
    update normally runs inside optimizer.step(), which is not called)."""
    if accelerator.scaler is not None:
        accelerator.scaler.update()
