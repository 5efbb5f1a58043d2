"""The tiny SDXL model: two CLIP encoders and micro-conditioning, on the briefly pretrained
4-channel VAE of sd_vae.py."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import DDPM_BETAS, clip_tokenizer_and_config
from simpletuner.models.tiny.sd_vae import pretrained_tiny_vae
from simpletuner.models.tiny.unet_models import tiny_unet


def build_sdxl(staging: Path):
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer, text_config = clip_tokenizer_and_config(staging, "tokenizer")
    tokenizer_2, text_config_2 = clip_tokenizer_and_config(staging, "tokenizer_2")
    time_embed_dim = 8
    unet = tiny_unet(
        cross_attention_dim=text_config.hidden_size + text_config_2.hidden_size,
        attention_head_dim=(2, 4), use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=time_embed_dim,
        # six micro-conditioning numbers, each embedded, plus the pooled text embedding
        projection_class_embeddings_input_dim=6 * time_embed_dim + text_config_2.projection_dim)
    scheduler = EulerDiscreteScheduler(**DDPM_BETAS, timestep_spacing="leading", steps_offset=1)
    return StableDiffusionXLPipeline(
        vae=pretrained_tiny_vae(), text_encoder=CLIPTextModel(text_config),
        text_encoder_2=CLIPTextModelWithProjection(text_config_2), tokenizer=tokenizer,
        tokenizer_2=tokenizer_2, unet=unet, scheduler=scheduler, add_watermarker=False)
