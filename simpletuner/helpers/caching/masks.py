"""Loss masks (``conditioning_type: mask``): each target's mask, paired by stem like an edit
reference and cached through the same path (fitted to the target's size and cut by its crop),
but kept as pixel weights instead of latents. The weights are the mask's red channel, 0 to 1
(white trains, black is ignored), as SimpleTuner reads masks. They are used twice: the target's
pixels are blended to grey where the mask is 0 before the VAE sees them, so what is masked out
never reaches the model, and the loss is weighted by the mask averaged over each latent cell."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# What a mask entry's key names instead of a VAE: a mask depends on no model.
MASK_IDENTITY = "loss-mask/red-channel"


def mask_weights(pixels: torch.Tensor) -> torch.Tensor:
    """[B, 3, H, W] in [-1, 1] (a fitted mask image) -> [B, 1, H, W] in [0, 1]."""
    return ((pixels[:, :1].float() + 1.0) / 2.0).clamp(0.0, 1.0)


def masked_pixels(pixels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """A fitted target ([3, H, W] in [-1, 1]) blended to grey (0) where ``weights``
    ([1, H, W]) is 0; unchanged where it is 1."""
    return pixels * weights.to(pixels.dtype)


def latent_grid(weights: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
    """Pixel weights [B, 1, H, W] averaged over each cell of the latents' grid: [B, 1, h, w]."""
    return F.interpolate(weights.float(), size=tuple(latents.shape[-2:]), mode="area")
