"""Pieces of the denoising objective that do not depend on the network: noise, timesteps,
targets and min-SNR weights. Random draws come from an explicit generator when one is given,
drawn on the generator's device and then moved (transfer.to_device: no host wait on CUDA), so a
fixed seed gives the same batch loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from simpletuner.models.transfer import to_device


def draw_noise(shape: torch.Size, *, device: torch.device, generator: torch.Generator | None,
               noise_offset: float = 0.0) -> torch.Tensor:
    """Gaussian noise, plus ``noise_offset`` times a per-sample, per-channel constant (it lets
    the model learn to shift overall brightness)."""
    draw_on = generator.device if generator is not None else device
    noise = torch.randn(shape, generator=generator, device=draw_on)
    if noise_offset:
        offset = torch.randn((shape[0], shape[1]) + (1,) * (len(shape) - 2),
                             generator=generator, device=draw_on)
        noise = noise + noise_offset * offset
    return to_device(noise, device)


def draw_timesteps(count: int, num_train_timesteps: int, *, device: torch.device,
                   generator: torch.Generator | None) -> torch.Tensor:
    """Uniform integer timesteps in [0, num_train_timesteps)."""
    draw_on = generator.device if generator is not None else device
    timesteps = torch.randint(0, num_train_timesteps, (count,), generator=generator,
                              device=draw_on)
    return to_device(timesteps, device)


def min_snr_weights(alphas_cumprod: torch.Tensor, timesteps: torch.Tensor, gamma: float,
                    prediction_type: str) -> torch.Tensor:
    """Per-sample loss weights of Min-SNR-gamma (Hang et al. 2023), as diffusers' training
    examples compute them: min(SNR, gamma) / SNR for epsilon, / (SNR + 1) for v-prediction."""
    alphas = alphas_cumprod.to(timesteps.device)[timesteps].float()
    snr = alphas / (1.0 - alphas)
    clipped = torch.minimum(snr, torch.full_like(snr, gamma))
    if prediction_type == "v_prediction":
        return clipped / (snr + 1.0)
    return clipped / snr


def weighted_mse(prediction: torch.Tensor, target: torch.Tensor,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error in float32, optionally weighted per sample."""
    if weights is None:
        return F.mse_loss(prediction.float(), target.float())
    per_sample = F.mse_loss(prediction.float(), target.float(), reduction="none")
    per_sample = per_sample.mean(dim=list(range(1, per_sample.ndim)))
    return (per_sample * weights).mean()
