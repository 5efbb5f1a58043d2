"""The rectified-flow objective SD3 and Flux train with, independent of the network: where on
the path from data (sigma 0) to noise (sigma 1) each sample is put, the noisy input there and
the velocity the network must predict. Draws come from an explicit generator when given."""

from __future__ import annotations

import math

import torch

from simpletuner.models.transfer import to_device

TIMESTEP_SAMPLINGS = ("uniform", "logit_normal")


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3's timestep shift: shift > 1 moves samples toward sigma 1 (more noise), as
    high-resolution images need; shift 1 leaves them as they are. Monotone, fixes 0 and 1."""
    if shift == 1.0:
        return sigmas
    return shift * sigmas / (1.0 + (shift - 1.0) * sigmas)


def resolution_shift(image_tokens: int, scheduler_config) -> float:
    """The shift a scheduler with use_dynamic_shifting (Flux) applies for an image of
    ``image_tokens`` packed tokens: exp(mu), mu linear in the token count, as FluxPipeline."""
    base_len = scheduler_config.get("base_image_seq_len", 256)
    max_len = scheduler_config.get("max_image_seq_len", 4096)
    base_shift = scheduler_config.get("base_shift", 0.5)
    max_shift = scheduler_config.get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return math.exp(base_shift + slope * (image_tokens - base_len))


def auto_shift(latent_shape: tuple[int, ...], scheduler_config) -> float:
    """SimpleTuner's flow_schedule_auto_shift: ``resolution_shift`` of the latents' token
    count, frames x (height // p) x (width // p) with p the scheduler's patch_size or 2, one
    frame for 4-D image latents, 5-D (..., frames, height, width) for clips."""
    frames = latent_shape[-3] if len(latent_shape) == 5 else 1
    patch = scheduler_config.get("patch_size") or 2
    height, width = latent_shape[-2:]
    return resolution_shift(frames * (height // patch) * (width // patch), scheduler_config)


def sample_sigmas(count: int, *, sampling: str, logit_mean: float = 0.0, logit_std: float = 1.0,
                  shift: float = 1.0, device: torch.device,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """``count`` noise levels in (0, 1): uniform, or logit-normal (sigmoid of a normal with
    ``logit_mean`` and ``logit_std``, so the median is sigmoid(logit_mean)); then shifted."""
    draw_on = generator.device if generator is not None else device
    if sampling == "uniform":
        sigmas = torch.rand(count, generator=generator, device=draw_on)
    elif sampling == "logit_normal":
        normal = torch.randn(count, generator=generator, device=draw_on)
        sigmas = torch.sigmoid(logit_mean + logit_std * normal)
    else:
        raise ValueError(f"flow_timestep_sampling {sampling!r} is not one of "
                         + ", ".join(TIMESTEP_SAMPLINGS))
    return to_device(shift_sigmas(sigmas, shift), device)


def flow_noisy_and_target(latents: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The point (1 - sigma) * latents + sigma * noise on the straight path and the velocity
    noise - latents along it (what the network predicts)."""
    sigma = sigmas.view(-1, *([1] * (latents.ndim - 1))).to(latents.dtype)
    return (1.0 - sigma) * latents + sigma * noise, noise - latents
