"""The one interface every model family implements; the trainer and caches only see this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class TrainingBatch:
    """One micro-batch as the model sees it: cached latents, cached prompt embeddings and the
    per-sample geometry SDXL-style micro-conditioning needs. Sizes are (height, width)."""

    latents: torch.Tensor                      # [B, C, h, w], already scaled for the model
    prompt_embeds: dict[str, torch.Tensor]     # each [B, ...], as returned by encode_prompts
    original_sizes: list[tuple[int, int]]
    crop_top_lefts: list[tuple[int, int]]
    target_sizes: list[tuple[int, int]]


@dataclass
class LossSettings:
    """Objective options from config.json that every family honours where they apply."""

    snr_gamma: float | None = None
    noise_offset: float = 0.0


class ModelAdapter(ABC):
    """A model family: loads its components from a local folder and knows its objective."""

    family: str

    @classmethod
    @abstractmethod
    def load(cls, folder: Path, *, device: torch.device, weight_dtype: torch.dtype,
             loss_settings: LossSettings) -> "ModelAdapter":
        """Load every component with from_pretrained from ``folder``; raise a clear error
        naming the expected layout when the folder is not this family's."""

    @property
    @abstractmethod
    def trainable(self) -> torch.nn.Module:
        """The network being fine-tuned (UNet or transformer)."""

    @abstractmethod
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] -> latents scaled (and shifted) for the trainable network."""

    @abstractmethod
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Prompts -> named embedding tensors, batch dimension first (one row per prompt)."""

    @abstractmethod
    def compute_loss(self, batch: TrainingBatch, generator: torch.Generator | None = None
                     ) -> torch.Tensor:
        """Sample noise and timesteps, run the trainable network, return the scalar loss."""

    @abstractmethod
    def build_pipeline(self):
        """A diffusers pipeline holding the current weights, for validation and export."""
