"""Pieces several tiny models share: CLIP and T5 text encoders with their locally written
tokenizers, the untrained KL VAEs of the flow models and FLUX.2's, and the DDPM betas of the UNet models."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.tokenizers import write_tiny_t5_tokenizer, write_tiny_tokenizer_files

TOKEN_LENGTH = 77
T5_TOKEN_LENGTH = 32  # short T5 context keeps the tiny flow models fast
DDPM_BETAS = {"num_train_timesteps": 1000, "beta_start": 0.00085, "beta_end": 0.012,
              "beta_schedule": "scaled_linear"}


def clip_tokenizer_and_config(staging: Path, subfolder: str):
    """A CLIPTokenizer written to ``staging/subfolder`` and a tiny CLIPTextConfig matching it."""
    from transformers import CLIPTextConfig, CLIPTokenizer

    ids = write_tiny_tokenizer_files(staging / subfolder, TOKEN_LENGTH)
    tokenizer = CLIPTokenizer.from_pretrained(staging / subfolder)
    config = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                            num_hidden_layers=2, max_position_embeddings=TOKEN_LENGTH,
                            projection_dim=32, hidden_act="gelu", layer_norm_eps=1e-5, **ids)
    return tokenizer, config


def tiny_kl_vae(scaling_factor: float, **overrides):
    """The (untrained) base of the flow models' VAEs."""
    from diffusers import AutoencoderKL

    # Four blocks give the real 8x downsampling, so buckets and latents keep real proportions.
    settings = dict(latent_channels=4, scaling_factor=scaling_factor) | overrides
    return AutoencoderKL(in_channels=3, out_channels=3, layers_per_block=1,
                         block_out_channels=(8, 16, 32, 32), norm_num_groups=8, sample_size=64,
                         down_block_types=("DownEncoderBlock2D",) * 4,
                         up_block_types=("UpDecoderBlock2D",) * 4, **settings)


def flow_vae(scaling_factor: float, shift_factor: float):
    """Like the SD3 and Flux VAEs: 16 latent channels, shifted and scaled, no quant convs."""
    return tiny_kl_vae(scaling_factor, latent_channels=16, shift_factor=shift_factor,
                       use_quant_conv=False, use_post_quant_conv=False)


def flux2_vae():
    """Like FLUX.2's VAE (ERNIE-Image and Ideogram 4 encode with it): 8 latent channels and a
    batch-norm over the packed latents, whose running statistics are drawn (seeded) away from
    (0, 1) so the latent normalisation is not an identity."""
    import torch
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, layers_per_block=1,
                             block_out_channels=(8, 16, 32, 32), latent_channels=8,
                             norm_num_groups=8, sample_size=64)
    channels = vae.bn.running_mean.shape[0]
    generator = torch.Generator().manual_seed(0)
    vae.bn.running_mean.copy_(0.1 * torch.randn(channels, generator=generator))
    vae.bn.running_var.copy_(0.5 + torch.rand(channels, generator=generator))
    return vae


def tiny_t5(staging: Path, subfolder: str, width: int):
    """A T5Tokenizer written to ``staging/subfolder`` and a tiny T5EncoderModel ``width`` wide."""
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    ids = write_tiny_t5_tokenizer(staging / subfolder, T5_TOKEN_LENGTH)
    config = T5Config(d_model=width, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, dropout_rate=0.0, **ids)
    return T5Tokenizer.from_pretrained(staging / subfolder), T5EncoderModel(config)
