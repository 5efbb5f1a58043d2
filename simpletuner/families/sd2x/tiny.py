"""The tiny SD 2.x model (v-prediction, like stable-diffusion-2-1)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.unet_models import build_sd


def build_sd2x(staging: Path):
    return build_sd(staging, v_prediction=True)
