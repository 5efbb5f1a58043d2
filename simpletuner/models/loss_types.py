"""SimpleTuner's loss_type: l2, or the pseudo-Huber losses ``huber`` and ``smooth_l1``, whose
threshold c may follow the sample's noise level (huber_schedule), as SimpleTuner computes them:

    huber:     2c (sqrt(d^2 + c^2) - c)      smooth_l1: 2 (sqrt(d^2 + c^2) - c)

elementwise with d = prediction - target, averaged per sample, then weighted (snr_gamma) and
averaged over the batch. Near 0 both behave like d^2 (scaled), far out like |d|.
"""

from __future__ import annotations

import torch

from simpletuner.models.noise_objective import weighted_mse


def huber_thresholds(schedule: str, huber_c: float, *, timesteps: torch.Tensor,
                     num_train_timesteps: int, noise_ratio: torch.Tensor) -> torch.Tensor:
    """c per sample. ``noise_ratio`` is SimpleTuner's sigma: sqrt((1 - alphabar_t) / alphabar_t)
    for the UNet families, sqrt((1 - s) / (s + 1e-4)) of the noise level s for flow matching.
    exponential: c ** (t / T), 1 at t = 0 down to c at t = T; snr: (1 - c) / (1 + sigma)^2 + c."""
    t = timesteps.float()
    if schedule == "constant":
        return torch.full_like(t, huber_c)
    if schedule == "exponential":
        return torch.pow(torch.full_like(t, huber_c), t / num_train_timesteps)
    if schedule == "snr":
        return (1.0 - huber_c) / (1.0 + noise_ratio.float()) ** 2 + huber_c
    raise ValueError(f"huber_schedule {schedule!r} is not one of snr, exponential, constant")


def flow_noise_ratio(sigmas: torch.Tensor) -> torch.Tensor:
    """SimpleTuner's sigma of a flow-matching sample at noise level s (its timestep / 1000)."""
    return ((1.0 - sigmas.float()) / (sigmas.float() + 1e-4)) ** 0.5


def ddpm_noise_ratio(alphas_cumprod: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    alphas = alphas_cumprod.to(timesteps.device)[timesteps].float()
    return ((1.0 - alphas) / alphas) ** 0.5


def objective_loss(prediction: torch.Tensor, target: torch.Tensor, *, loss_type: str,
                   thresholds: torch.Tensor | None = None,
                   weights: torch.Tensor | None = None,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """The batch loss in float32; ``thresholds`` (c per sample) for the pseudo-Huber types;
    ``mask`` ([B, 1, h, w], conditioning_type 'mask'): each position's weight, as SimpleTuner
    applies it (elementwise, before the per-sample mean)."""
    if loss_type == "l2" and mask is None:
        return weighted_mse(prediction, target, weights)
    if loss_type == "l2":
        elementwise = (prediction.float() - target.float()) ** 2
    elif loss_type in ("huber", "smooth_l1"):
        c = thresholds.float().view(-1, *([1] * (prediction.ndim - 1))).to(prediction.device)
        distance = torch.sqrt((prediction.float() - target.float()) ** 2 + c ** 2) - c
        elementwise = 2.0 * (c * distance if loss_type == "huber" else distance)
    else:
        raise ValueError(f"loss_type {loss_type!r} is not one of l2, huber, smooth_l1")
    if mask is not None:  # a video family's one-frame clip: [B, C, 1, h, w]
        mask = mask.unsqueeze(2) if elementwise.ndim == mask.ndim + 1 else mask
        elementwise = elementwise * mask.to(elementwise.device, torch.float32)
    per_sample = elementwise.mean(dim=list(range(1, elementwise.ndim)))
    return (per_sample * weights).mean() if weights is not None else per_sample.mean()
