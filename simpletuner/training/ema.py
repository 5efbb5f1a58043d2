"""Exponential moving average of the trained weights, saved as safetensors."""

from __future__ import annotations

from pathlib import Path

import torch

from simpletuner.training.checkpointing.tensor_files import load_tensors, save_tensors


class EMAWeights:
    """Shadow copies of a module's trainable parameters, updated after each optimizer step."""

    def __init__(self, module: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {name: p.detach().clone().float()
                       for name, p in module.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        for name, p in module.named_parameters():
            if name in self.shadow:
                self.shadow[name].lerp_(p.detach().float(), 1.0 - self.decay)

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
