"""Exponential moving average of the trained weights, saved as safetensors."""

from __future__ import annotations

from pathlib import Path

import torch

from simpletuner.training.checkpointing.tensor_files import load_tensors, save_tensors


def decay_at(step: int, decay: float, *, update_interval: int | None = None,
             warmup_steps: int = 0) -> float | None:
    """The EMA's decay after optimizer step ``step`` (counted from 1), or None where it is not
    updated, as SimpleTuner's: only steps that are multiples of ``update_interval``; 0 (the
    weights copied) at steps before ``warmup_steps``, then ``decay``. A pure function of the
    step, so a resumed run updates exactly as the uninterrupted one did."""
    if update_interval is not None and step % update_interval != 0:
        return None
    return 0.0 if step < warmup_steps else decay


class EMAWeights:
    """Shadow copies of a module's trainable parameters, updated after optimizer steps."""

    def __init__(self, module: torch.nn.Module, decay: float, *,
                 update_interval: int | None = None, warmup_steps: int = 0):
        self.decay = decay
        self.update_interval = update_interval
        self.warmup_steps = warmup_steps
        self.shadow = {name: p.detach().clone().float()
                       for name, p in module.named_parameters() if p.requires_grad}

    @classmethod
    def for_run(cls, module: torch.nn.Module, training) -> "EMAWeights":
        """With ``training``'s (a TrainingConfig's) ema_decay, interval and warm-up."""
        return cls(module, training.ema_decay, update_interval=training.ema_update_interval,
                   warmup_steps=training.ema_warmup_steps)

    @torch.no_grad()
    def update(self, module: torch.nn.Module, step: int) -> None:
        """After optimizer step ``step`` (from 1): moved toward the weights, or left."""
        decay = decay_at(step, self.decay, update_interval=self.update_interval,
                         warmup_steps=self.warmup_steps)
        if decay is None:
            return
        for name, p in module.named_parameters():
            if name in self.shadow:
                self.shadow[name].lerp_(p.detach().float(), 1.0 - decay)

    @torch.no_grad()
    def copy_to(self, module: torch.nn.Module) -> None:
        for name, p in module.named_parameters():
            if name in self.shadow:
                p.copy_(self.shadow[name].to(p.dtype))

    @torch.no_grad()
    def swap(self, module: torch.nn.Module) -> None:
        """Exchange the module's weights and the shadow; a second call restores both. Used to
        validate or export with EMA weights without holding a third copy."""
        for name, p in module.named_parameters():
            if name in self.shadow:
                live = p.detach().float().clone()
                p.copy_(self.shadow[name].to(p.dtype))
                self.shadow[name] = live

    def save(self, path: Path) -> None:
        """Refused when non-finite; atomic and flushed (see tensor_files.save_tensors)."""
        save_tensors(self.shadow, path)

    def load(self, path: Path) -> None:
        loaded = load_tensors(Path(path))  # refuses damaged and non-finite files
        missing = set(self.shadow) - set(loaded)
        if missing:
            raise ValueError(f"{path}: EMA weights lack {len(missing)} parameters "
                             f"(e.g. {sorted(missing)[0]}); was it saved for another model?")
        self.shadow = {name: loaded[name].float() for name in self.shadow}
