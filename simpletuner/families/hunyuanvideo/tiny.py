"""The tiny HunyuanVideo 1.5 models: HunyuanVideo15Pipeline's own classes at toy widths, as
diffusers' pipeline tests build them, but with the real model's 16x spatial and 4x temporal
compression (so buckets and the 4n+1 frame rule keep their real proportions): a one-block
HunyuanVideo15Transformer3DModel, the causal 3D VAE, a two-layer Qwen2.5-VL text model with a
locally written byte-level Qwen2 tokenizer (its chat template), and a tiny ByT5 glyph encoder
with ByT5's own tokenizer (bytes, no vocabulary file). The image-to-video sibling adds a tiny
SigLIP vision encoder."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.tokenizers import QWEN3_CHAT_TEMPLATE, write_tiny_qwen2_tokenizer

LATENT_CHANNELS = 4
TEXT_WIDTH, GLYPH_WIDTH, IMAGE_WIDTH = 16, 32, 12
# The pipeline pads prompts to its 108 template tokens + 1000 (one token per byte here).
TEXT_POSITIONS = 2048
BYT5_VOCABULARY = 384  # ByT5Tokenizer's: 3 special tokens, 256 bytes, 125 extra ids


def tiny_qwen25_text(staging: Path):
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, Qwen2Tokenizer

    ids = write_tiny_qwen2_tokenizer(staging / "tokenizer", TEXT_POSITIONS,
                                     chat_template=QWEN3_CHAT_TEMPLATE)
    config = Qwen2_5_VLTextConfig(
        hidden_size=TEXT_WIDTH, intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=TEXT_POSITIONS,
        rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
        rope_theta=1000000.0, **ids)
    return Qwen2Tokenizer.from_pretrained(staging / "tokenizer"), Qwen2_5_VLTextModel(config)


def tiny_byt5():
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    config = T5Config(vocab_size=BYT5_VOCABULARY, d_model=GLYPH_WIDTH, d_kv=8, d_ff=37,
                      num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                      dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0)
    return ByT5Tokenizer(), T5EncoderModel(config)


def tiny_vae():
    """16x spatial (four downsampling stages), 4x temporal (the last two), 4 latent channels."""
    from diffusers import AutoencoderKLHunyuanVideo15

    return AutoencoderKLHunyuanVideo15(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
        block_out_channels=(8, 8, 16, 16, 16), layers_per_block=1,
        spatial_compression_ratio=16, temporal_compression_ratio=4)


def tiny_transformer(task_type: str):
    from diffusers import HunyuanVideo15Transformer3DModel

    return HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1, out_channels=LATENT_CHANNELS,
        num_attention_heads=2, attention_head_dim=8, num_layers=1, num_refiner_layers=1,
        mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=TEXT_WIDTH,
        text_embed_2_dim=GLYPH_WIDTH, image_embed_dim=IMAGE_WIDTH, rope_axes_dim=(2, 2, 4),
        target_size=64, task_type=task_type)


def shared_parts(staging: Path, task_type: str) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.guiders import ClassifierFreeGuidance

    tokenizer, text_encoder = tiny_qwen25_text(staging)
    tokenizer_2, text_encoder_2 = tiny_byt5()
    return dict(transformer=tiny_transformer(task_type), vae=tiny_vae(),
                # HunyuanVideo-1.5-Diffusers-480p_t2v's scheduler and guider
                scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
                text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                tokenizer_2=tokenizer_2, guider=ClassifierFreeGuidance(guidance_scale=6.0))


def build_hunyuanvideo(staging: Path):
    from diffusers import HunyuanVideo15Pipeline

    return HunyuanVideo15Pipeline(**shared_parts(staging, "t2v"))


def tiny_siglip():
    """A tiny SiglipVisionModel (HunyuanVideo 1.5 I2V's image encoder is SigLIP so400m; 32x32
    input, 16 patches here) and the PIL SigLIP image processor fitted to it (no torchvision)."""
    from transformers import SiglipVisionConfig, SiglipVisionModel
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    config = SiglipVisionConfig(hidden_size=IMAGE_WIDTH, intermediate_size=16,
                                num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                patch_size=8)
    return SiglipImageProcessorPil(size={"height": 32, "width": 32}), SiglipVisionModel(config)


def build_hunyuanvideo_i2v(staging: Path):
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    feature_extractor, image_encoder = tiny_siglip()
    return HunyuanVideo15ImageToVideoPipeline(
        **shared_parts(staging, "i2v"), image_encoder=image_encoder,
        feature_extractor=feature_extractor)
