"""The tiny Wan 2.2 T2V-A14B model: tiny Wan 2.1's parts (the Wan 2.1 VAE and UMT5, as A14B
has) with two one-block experts, transformer/ for high noise and transformer_2/ for low, and
Wan2.2-T2V-A14B-Diffusers' boundary_ratio 0.875."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.wan_model import build_wan, tiny_wan_transformer

BOUNDARY_RATIO = 0.875  # Wan2.2-T2V-A14B-Diffusers' model_index.json


def build_wan22(staging: Path):
    from diffusers import WanPipeline

    one_expert = build_wan(staging)
    low_noise_expert = tiny_wan_transformer(one_expert.text_encoder.config.d_model)
    return WanPipeline(transformer=one_expert.transformer, transformer_2=low_noise_expert,
                       vae=one_expert.vae, text_encoder=one_expert.text_encoder,
                       tokenizer=one_expert.tokenizer, scheduler=one_expert.scheduler,
                       boundary_ratio=BOUNDARY_RATIO)
