"""The tiny Chroma model: a one-double-block, one-single-block ChromaTransformer2DModel, one T5
encoder and the Flux VAE's shift and scale, scheduled like Chroma1-HD (resolution-dependent
shift)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import flow_vae, tiny_t5


def build_chroma(staging: Path):
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    tokenizer, text_encoder = tiny_t5(staging, "tokenizer", 32)
    transformer = ChromaTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=text_encoder.config.d_model,
        axes_dims_rope=(4, 6, 6), approximator_num_channels=16, approximator_hidden_dim=32,
        approximator_layers=1)
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096)
    return ChromaPipeline(transformer=transformer, scheduler=scheduler,
                          vae=flow_vae(0.3611, 0.1159), text_encoder=text_encoder,
                          tokenizer=tokenizer)
