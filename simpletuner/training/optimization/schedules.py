"""The learning-rate schedule from config.json, with SimpleTuner's lr_end, lr_power and
lr_num_cycles (diffusers' get_scheduler passes neither lr_end nor power to every schedule)."""

from __future__ import annotations

from diffusers.optimization import get_polynomial_decay_schedule_with_warmup, get_scheduler

from simpletuner.training.settings import ScheduleSettings


def build_lr_scheduler(settings: ScheduleSettings, optimizer, total_steps: int):
    """lr_end and lr_power shape 'polynomial'; lr_num_cycles counts the restarts of
    'cosine_with_restarts'."""
    if settings.lr_scheduler == "polynomial":
        return get_polynomial_decay_schedule_with_warmup(
            optimizer, num_warmup_steps=settings.lr_warmup_steps, num_training_steps=total_steps,
            lr_end=settings.lr_end, power=settings.lr_power)
    return get_scheduler(settings.lr_scheduler, optimizer,
                         num_warmup_steps=settings.lr_warmup_steps,
                         num_training_steps=total_steps, num_cycles=settings.lr_num_cycles)


def scheduled_lr(lr_scheduler, step: int) -> float:
    """What ``lr_scheduler`` (a LambdaLR, as every schedule above is) gives its first parameter
    group at ``step``, whatever state was loaded into it."""
    return lr_scheduler.base_lrs[0] * lr_scheduler.lr_lambdas[0](step)
