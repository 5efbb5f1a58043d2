"""The tiny flow-matching models with CLIP and T5 text encoders: SD3 and Flux (FLUX.1-dev-like)."""

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


def build_flux(staging: Path):
    from diffusers import FluxPipeline

    return _flux_parts(staging, FluxPipeline)


def build_flux_kontext(staging: Path):
    """The same network as tiny-flux (FLUX.1 Kontext-dev is FLUX.1-dev's), saved as Kontext."""
    from diffusers import FluxKontextPipeline

    return _flux_parts(staging, FluxKontextPipeline)


def _flux_parts(staging: Path, pipeline_class: type):
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel

    tokenizer, text_config = clip_tokenizer_and_config(staging, "tokenizer")
    tokenizer_2, text_encoder_2 = tiny_t5(staging, "tokenizer_2", 32)
    # Like FLUX.1-dev: guidance-distilled, resolution-dependent shift.
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=text_encoder_2.config.d_model,
        pooled_projection_dim=text_config.hidden_size, guidance_embeds=True,
        axes_dims_rope=(4, 6, 6))
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096)
    return pipeline_class(
        transformer=transformer, scheduler=scheduler, vae=flow_vae(0.3611, 0.1159),
        text_encoder=CLIPTextModel(text_config), tokenizer=tokenizer,
        text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2)
