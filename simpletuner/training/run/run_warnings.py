"""Warnings about a run that will work, but not as the config's author probably expects."""

from __future__ import annotations

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


def run_warnings(training, processes: int, remaining_steps: int) -> list[str]:
    """``training`` is a configuration.TrainingConfig."""
    found = [process_count_warning(training.num_processes, processes)]
    if training.use_ema:
        found.append(ema_warning(training.ema_decay, remaining_steps))
    return [warning for warning in found if warning]
