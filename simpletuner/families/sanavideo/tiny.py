"""The tiny SANA-Video model: SanaVideoPipeline's own classes at toy widths, as diffusers'
pipeline tests build them: a one-block SanaVideoTransformer3DModel, a narrow Wan 2.1 VAE (8x
spatial, 4x temporal, its latents_mean/latents_std), a Gemma2 text encoder with Lumina 2's
locally written Gemma tokenizer, and DPM-Solver++ on flow sigmas."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families.lumina2.tiny import write_tiny_gemma_tokenizer

TEXT_WIDTH = 16
# The pipeline prepends its instruction (~1200 characters, one token each here) to 300 tokens.
TEXT_POSITIONS = 2048


def build_sanavideo(staging: Path):
    from diffusers import (AutoencoderKLWan, DPMSolverMultistepScheduler, SanaVideoPipeline,
                           SanaVideoTransformer3DModel)
    from transformers import AutoTokenizer, Gemma2Config, Gemma2Model

    ids = write_tiny_gemma_tokenizer(staging / "tokenizer")
    text_encoder = Gemma2Model(Gemma2Config(
        hidden_size=TEXT_WIDTH, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=TEXT_POSITIONS, sliding_window=TEXT_POSITIONS, **ids))
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    transformer = SanaVideoTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12,
        num_layers=1, num_cross_attention_heads=2, cross_attention_head_dim=12,
        cross_attention_dim=24, caption_channels=TEXT_WIDTH, mlp_ratio=2.5, sample_size=8,
        patch_size=(1, 2, 2), rope_max_seq_len=32)
    scheduler = DPMSolverMultistepScheduler(prediction_type="flow_prediction",
                                            use_flow_sigmas=True, flow_shift=8.0)
    tokenizer = AutoTokenizer.from_pretrained(staging / "tokenizer",
                                              model_max_length=TEXT_POSITIONS)
    return SanaVideoPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                             transformer=transformer, scheduler=scheduler)
