"""The tiny Wan 2.2 models. T2V-A14B: tiny Wan 2.1's parts (the Wan 2.1 VAE and UMT5, as A14B
has) with two one-block experts, transformer/ for high noise and transformer_2/ for low, and
Wan2.2-T2V-A14B-Diffusers' boundary_ratio 0.875. TI2V-5B: tiny UMT5, the Wan 2.2 VAE."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families.wan.tiny import build_wan, tiny_umt5, tiny_wan_transformer

BOUNDARY_RATIO = 0.875  # Wan2.2-T2V-A14B-Diffusers' model_index.json


def build_wan22(staging: Path):
    from diffusers import WanPipeline

    one_expert = build_wan(staging)
    low_noise_expert = tiny_wan_transformer(one_expert.text_encoder.config.d_model)
    return WanPipeline(transformer=one_expert.transformer, transformer_2=low_noise_expert,
                       vae=one_expert.vae, text_encoder=one_expert.text_encoder,
                       tokenizer=one_expert.tokenizer, scheduler=one_expert.scheduler,
                       boundary_ratio=BOUNDARY_RATIO)


def build_wan22_ti2v(staging: Path):
    """TI2V-5B's layout: the Wan 2.2 VAE (48 latent channels, residual blocks, its own 2x2
    patchify, 16x spatial; seeded latents_mean/std) and a 48-channel transformer; the pipeline
    expands timesteps per token."""
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline

    tokenizer, text_encoder = tiny_umt5(staging, "tokenizer", 32)
    statistics = torch.Generator().manual_seed(1)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2,
        dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
        scale_factor_spatial=16,
        latents_mean=(torch.randn(48, generator=statistics) * 0.5).tolist(),
        latents_std=(torch.rand(48, generator=statistics) + 0.5).tolist())
    transformer = tiny_wan_transformer(text_encoder.config.d_model, channels=48)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=5.0)
    return WanPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder,
                       tokenizer=tokenizer, scheduler=scheduler, expand_timesteps=True)
