"""The tiny SD3 model: CLIP-L, CLIP-G and T5 text encoders."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import clip_tokenizer_and_config, flow_vae, tiny_t5


def build_sd3(staging: Path):
    from diffusers import (
        FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline)
    from transformers import CLIPTextModelWithProjection

    tokenizer, text_config = clip_tokenizer_and_config(staging, "tokenizer")
    tokenizer_2, text_config_2 = clip_tokenizer_and_config(staging, "tokenizer_2")
    # T5 as wide as both CLIP hidden states side by side, as in SD3 (the pipeline pads to it).
    t5_width = text_config.hidden_size + text_config_2.hidden_size
    tokenizer_3, text_encoder_3 = tiny_t5(staging, "tokenizer_3", t5_width)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2,
        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
        joint_attention_dim=t5_width, pos_embed_max_size=32,
        pooled_projection_dim=text_config.projection_dim + text_config_2.projection_dim)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=flow_vae(1.5305, 0.0609), text_encoder=CLIPTextModelWithProjection(text_config),
        tokenizer=tokenizer, text_encoder_2=CLIPTextModelWithProjection(text_config_2),
        tokenizer_2=tokenizer_2, text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3)
