"""Warnings about a run that will work, but not as the config's author probably expects."""

from __future__ import annotations

import math

EMA_STUCK_FRACTION = 0.5  # warn when the EMA would still be mostly the starting weights


def process_count_warning(configured: int, started: int) -> str | None:
    if configured == started:
        return None
    return (f"config.json asks for num_processes {configured}, but the launcher started "
            f"{started}; the effective batch and the split follow the {started} running. "
            "./train.sh launches num_processes; with accelerate launch, pass --num_processes")


def ema_warning(decay: float, steps: int) -> str | None:
    """The share of the starting weights left in the EMA after ``steps`` updates is
    decay**steps: near 1, the validated and exported EMA weights barely move."""
    if steps <= 0:
        return None
    left = decay ** steps
    if left <= EMA_STUCK_FRACTION:
        return None
    return (f"use_ema with ema_decay {decay:g} over {steps} steps: the EMA weights (validated "
            f"and exported) keep {left:.0%} of the starting weights, so they barely move; lower "
            f"ema_decay (below {EMA_STUCK_FRACTION ** (1 / steps):.4f}) or train longer")


def warmup_warning(lr_scheduler: str, warmup_steps: int) -> str | None:
    """diffusers' 'constant' schedule takes no warm-up: the steps would be silently ignored."""
    if lr_scheduler != "constant" or not warmup_steps:
        return None
    return (f"lr_warmup_steps {warmup_steps} has no effect with lr_scheduler 'constant'; use "
            "'constant_with_warmup' to warm up, or remove lr_warmup_steps")


def resumed_lr_warning(step: int, saved_lr: float, scheduled_lr: float) -> str | None:
    """The schedule is rebuilt from this run's settings, so a changed max_train_steps (or
    learning_rate, lr_scheduler, warm-up) moves the learning rate at the resumed step."""
    if math.isclose(saved_lr, scheduled_lr, rel_tol=1e-6, abs_tol=1e-12):
        return None
    return (f"resuming at step {step}: the learning rate was {saved_lr:.3g} when the checkpoint "
            f"was saved and this run's schedule gives {scheduled_lr:.3g} there, because "
            "max_train_steps, num_train_epochs, learning_rate, lr_scheduler or lr_warmup_steps "
            "changed; training follows the new schedule from here")


def run_warnings(training, processes: int, remaining_steps: int) -> list[str]:
    """``training`` is a configuration.TrainingConfig."""
    found = [process_count_warning(training.num_processes, processes),
             warmup_warning(training.lr_scheduler, training.lr_warmup_steps)]
    if training.use_ema:
        found.append(ema_warning(training.ema_decay, remaining_steps))
    return [warning for warning in found if warning]
