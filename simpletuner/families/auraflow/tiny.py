"""The tiny AuraFlow model: AuraFlowPipeline's own classes (AuraFlowTransformer2DModel with one
joint and one single block, a UMT5 encoder, a 4-channel KL VAE scaled like SDXL's) at toy
widths, with the locally written T5 tokenizer."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import tiny_kl_vae
from simpletuner.models.tiny.tokenizers import write_tiny_t5_tokenizer

TOKEN_LENGTH = 256  # AuraFlowPipeline's max_sequence_length
TEXT_WIDTH = 32


def build_auraflow(staging: Path):
    from diffusers import (AuraFlowPipeline, AuraFlowTransformer2DModel,
                           FlowMatchEulerDiscreteScheduler)
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    ids = write_tiny_t5_tokenizer(staging / "tokenizer", TOKEN_LENGTH)
    text_encoder = UMT5EncoderModel(UMT5Config(
        d_model=TEXT_WIDTH, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0, **ids))
    transformer = AuraFlowTransformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_mmdit_layers=1,
        num_single_dit_layers=1, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=TEXT_WIDTH, caption_projection_dim=32, pos_embed_max_size=64)
    # AuraFlow's own scheduler: a fixed shift of 1.73.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.73)
    return AuraFlowPipeline(tokenizer=T5Tokenizer.from_pretrained(staging / "tokenizer"),
                            text_encoder=text_encoder, vae=tiny_kl_vae(0.13025),
                            transformer=transformer, scheduler=scheduler)
