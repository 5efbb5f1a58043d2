"""The tiny SD 1.x model (epsilon prediction, like stable-diffusion-v1-5)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.unet_models import build_sd


def build_sd1x(staging: Path):
    return build_sd(staging, v_prediction=False)
