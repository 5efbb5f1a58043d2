"""The learning-rate schedule from config.json, with SimpleTuner's lr_end, lr_power and
lr_num_cycles (diffusers' get_scheduler passes neither lr_end nor power to every schedule)."""

from __future__ import annotations

from diffusers.optimization import get_polynomial_decay_schedule_with_warmup, get_scheduler


def build_lr_scheduler(training, optimizer, total_steps: int):
    """``training`` is a configuration.TrainingConfig. lr_end and lr_power shape 'polynomial';
    lr_num_cycles counts the restarts of 'cosine_with_restarts'."""
    if training.lr_scheduler == "polynomial":
        return get_polynomial_decay_schedule_with_warmup(
            optimizer, num_warmup_steps=training.lr_warmup_steps, num_training_steps=total_steps,
            lr_end=training.lr_end, power=training.lr_power)
    return get_scheduler(training.lr_scheduler, optimizer,
                         num_warmup_steps=training.lr_warmup_steps,
                         num_training_steps=total_steps, num_cycles=training.lr_num_cycles)
