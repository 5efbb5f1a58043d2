"""Conditioning images generated from the training images themselves (SimpleTuner's
``conditioning`` block on a dataset), with no model: ``canny`` edges, as OpenCV's Canny computes
them (3x3 Sobel, L1 gradient magnitude, non-maximum suppression, hysteresis between
``low_threshold`` and ``high_threshold`` on 0-255 grey levels), white on black. Pure numpy on
the fitted image, so a sample's control image is the same on every rank and every run; the
latent cache keeps what the ControlNet takes of it (references.py), made once."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

CANNY_DEFAULTS = {"low_threshold": 100.0, "high_threshold": 200.0}  # SimpleTuner's guide


def _shifted(padded: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """The image inside a 1-pixel ``padded`` border, moved by (dy, dx)."""
    h, w = padded.shape[0] - 2, padded.shape[1] - 2
    return padded[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]


def _sobel(grey: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.pad(grey, 1, mode="edge")
    gx = (_shifted(p, -1, 1) + 2 * _shifted(p, 0, 1) + _shifted(p, 1, 1)
          - _shifted(p, -1, -1) - 2 * _shifted(p, 0, -1) - _shifted(p, 1, -1))
    gy = (_shifted(p, 1, -1) + 2 * _shifted(p, 1, 0) + _shifted(p, 1, 1)
          - _shifted(p, -1, -1) - 2 * _shifted(p, -1, 0) - _shifted(p, -1, 1))
    return gx, gy


def _thin(magnitude: np.ndarray, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """Non-maximum suppression along the gradient, quantised to 4 directions."""
    angle = (np.degrees(np.arctan2(gy, gx)) + 180.0) % 180.0
    sector = ((angle + 22.5) // 45).astype(int) % 4  # 0: horizontal, 1: 45, 2: vertical, 3: 135
    padded = np.pad(magnitude, 1)
    keep = np.zeros_like(magnitude, dtype=bool)
    for index, (dy, dx) in enumerate(((0, 1), (1, 1), (1, 0), (1, -1))):
        ahead, behind = _shifted(padded, dy, dx), _shifted(padded, -dy, -dx)
        keep |= (sector == index) & (magnitude > behind) & (magnitude >= ahead)
    return np.where(keep, magnitude, 0.0)


def _hysteresis(strong: np.ndarray, weak: np.ndarray) -> np.ndarray:
    """Weak edges kept where 8-connected to a strong one."""
    edges = strong.copy()
    while True:
        padded = np.pad(edges, 1)
        grown = np.zeros_like(edges)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                grown |= _shifted(padded, dy, dx)
        grown &= weak
        grown |= edges
        if np.array_equal(grown, edges):
            return edges
        edges = grown


def canny(image: np.ndarray, low_threshold: float, high_threshold: float) -> np.ndarray:
    """[H, W, 3] 0-255 -> [H, W] bool edges."""
    grey = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    gx, gy = _sobel(np.round(grey))
    thinned = _thin(np.abs(gx) + np.abs(gy), gx, gy)
    return _hysteresis(thinned > high_threshold, thinned > low_threshold)


def generator(block: Mapping) -> Callable[[torch.Tensor], torch.Tensor]:
    """What a ``conditioning`` block makes of fitted images [B, 3, H, W] in [-1, 1]: the
    generated images, in the same form."""
    low = float(block.get("low_threshold", CANNY_DEFAULTS["low_threshold"]))
    high = float(block.get("high_threshold", CANNY_DEFAULTS["high_threshold"]))

    def edges(pixels: torch.Tensor) -> torch.Tensor:
        images = ((pixels.detach().float().cpu() + 1.0) * 127.5).round().clamp(0, 255)
        found = [canny(image.permute(1, 2, 0).numpy(), low, high) for image in images]
        white = torch.from_numpy(np.stack(found)).to(pixels.dtype)[:, None].expand_as(pixels)
        return (white * 2.0 - 1.0).to(pixels.device)

    return edges


def generator_identity(block: Mapping) -> str:
    """What of the block decides the generated images, for the cache key."""
    return (f"canny/{float(block.get('low_threshold', CANNY_DEFAULTS['low_threshold']))}/"
            f"{float(block.get('high_threshold', CANNY_DEFAULTS['high_threshold']))}")


def generated_then(generate: Callable[[torch.Tensor], torch.Tensor],
                   encode: Callable[[torch.Tensor], torch.Tensor]
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
    """``encode`` of what ``generate`` makes of the fitted images."""
    return lambda pixels: encode(generate(pixels))
