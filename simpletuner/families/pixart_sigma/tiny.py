"""The tiny PixArt Sigma model: PixArtSigmaPipeline's own classes (PixArtTransformer2DModel with
learned sigma, a T5 encoder) at toy widths, on an untrained 8x KL VAE with SDXL's scaling
factor (PixArt Sigma's VAE is SDXL's)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import tiny_kl_vae, tiny_t5

T5_WIDTH = 32


def build_pixart_sigma(staging: Path):
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    tokenizer, text_encoder = tiny_t5(staging, "tokenizer", T5_WIDTH)
    # out_channels twice in_channels: noise and its variance, as PixArt predicts them.
    transformer = PixArtTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
        num_layers=2, cross_attention_dim=16, caption_channels=T5_WIDTH, sample_size=8,
        patch_size=2, norm_num_groups=1)
    # PixArt-Sigma's folders: DPM-Solver++ on linear betas.
    scheduler = DPMSolverMultistepScheduler(beta_schedule="linear", beta_start=0.0001,
                                            beta_end=0.02, num_train_timesteps=1000)
    return PixArtSigmaPipeline(tokenizer=tokenizer, text_encoder=text_encoder,
                               vae=tiny_kl_vae(0.13025), transformer=transformer,
                               scheduler=scheduler)
