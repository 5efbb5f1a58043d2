"""Stable Diffusion 2.x: the SD 1.x layout and objective; whether it predicts epsilon (2.x-base)
or v (768-v) comes from the scheduler's prediction_type, which the shared code already reads."""

from __future__ import annotations

from simpletuner.families.sd1x.adapter import SD1xAdapter


class SD2xAdapter(SD1xAdapter):
    family = "sd2x"
