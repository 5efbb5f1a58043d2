"""Noise levels drawn from the training distribution (uniform or logit-normal, then shifted:
flow_objective.py) conditioned on a sub-range of sigma, as a Wan 2.2 A14B expert trains: the
high-noise expert on [boundary, 1), the low-noise one below it. Because the shift is monotone,
the condition becomes an interval of the unshifted draw, sampled exactly by its inverse CDF:
one draw per sample, no rejection loop, so a fixed generator gives fixed levels."""

from __future__ import annotations

import torch

from simpletuner.models.flow_objective import shift_sigmas
from simpletuner.models.transfer import to_device


def unshift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """The inverse of shift_sigmas: the unshifted level that ``shift`` moves to ``sigmas``."""
    return sigmas / (shift - (shift - 1.0) * sigmas)


def _truncated_logit_normal(uniform: torch.Tensor, low: float, high: float, mean: float,
                            std: float) -> torch.Tensor:
    """sigmoid(mean + std * z), z a standard normal conditioned so the result is in
    [low, high]: z = ndtri of a uniform point between ndtr of the two bounds."""
    bounds = torch.tensor([low, high], dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    z_bounds = (torch.logit(bounds) - mean) / std
    lower, upper = torch.special.ndtr(z_bounds)
    z = torch.special.ndtri(lower + uniform.to(torch.float64) * (upper - lower))
    return torch.sigmoid(mean + std * z).to(uniform.dtype)


def sample_sigmas_in_range(count: int, *, low: float, high: float, sampling: str,
                           logit_mean: float = 0.0, logit_std: float = 1.0, shift: float = 1.0,
                           device: torch.device, generator: torch.Generator | None = None
                           ) -> torch.Tensor:
    """``count`` shifted noise levels in [low, high], distributed as sample_sigmas' draws are
    on that interval."""
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"a sigma range needs 0 <= low < high <= 1; got [{low}, {high}]")
    draw_on = generator.device if generator is not None else device
    uniform = torch.rand(count, generator=generator, device=draw_on)
    bounds = unshift_sigmas(torch.tensor([low, high], dtype=torch.float64), shift).tolist()
    if sampling == "uniform":
        unshifted = bounds[0] + (bounds[1] - bounds[0]) * uniform
    elif sampling == "logit_normal":
        unshifted = _truncated_logit_normal(uniform, *bounds, logit_mean, logit_std)
    else:
        raise ValueError(f"flow_timestep_sampling {sampling!r} is not uniform or logit_normal")
    sigmas = shift_sigmas(unshifted, shift).clamp(low, high)  # float rounding at the ends
    return to_device(sigmas, device)
