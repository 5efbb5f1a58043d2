"""The tiny Flux models (FLUX.1-dev-like), with CLIP and T5 text encoders; Kontext is the same
network saved as FluxKontextPipeline."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import clip_tokenizer_and_config, flow_vae, tiny_t5


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
