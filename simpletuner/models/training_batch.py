"""One micro-batch as the model sees it. Its own module, without diffusers, because the data
path builds batches and never needs a model adapter."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TrainingBatch:
    """One micro-batch as the model sees it: cached latents, cached prompt embeddings and the
    per-sample geometry SDXL-style micro-conditioning needs. Sizes are (height, width)."""

    latents: torch.Tensor  # [B, C, h, w] ([B, C, F, h, w] for video families), model-scaled
    prompt_embeds: dict[str, torch.Tensor]     # each [B, ...], as returned by encode_prompts
    original_sizes: list[tuple[int, int]]
    crop_top_lefts: list[tuple[int, int]]
    target_sizes: list[tuple[int, int]]
    # edit models: one [B, C, h, w] per conditioning dataset, each sample's own reference
    reference_latents: tuple[torch.Tensor, ...] = ()
    # Per-sample tensors a family caches with the latents (Wan I2V: first-frame latents and
    # CLIP image embedding), each [B, ...]; empty for the others.
    conditioning: dict[str, torch.Tensor] = field(default_factory=dict)
    # conditioning_type 'mask': each sample's loss weights on the latent grid, [B, 1, h, w]
    # (1: trained, 0: ignored); None: every position weighs 1.
    loss_mask: torch.Tensor | None = None
    # controlnet: each sample's control image as the family's ControlNet takes it (SDXL:
    # pixels [B, 3, H, W] in [0, 1]; Flux: latents [B, C, h, w]); None without a ControlNet.
    control: torch.Tensor | None = None
