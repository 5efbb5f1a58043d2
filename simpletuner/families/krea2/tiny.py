"""The tiny Krea 2: Krea2Pipeline's own classes (Krea2Transformer2DModel with one block and one
text-fusion block of each kind, the Qwen-Image VAE, a two-layer Qwen3VLModel whose embedding
and last hidden states the pipeline stacks) at toy widths, with a byte-level Qwen2 tokenizer
written locally."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.tokenizers import write_tiny_qwen2_tokenizer

TEXT_WIDTH = 32
TEXT_LAYERS = (1, 2)  # the hidden states the tiny pipeline stacks (the real one: 12 of 37)
# Qwen3-VL's vision tokens, so its config's ids name tokens the tokenizer knows.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Krea 2's published scheduler: the resolution-aware exponential shift.
KREA2_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=6400,
                       max_shift=1.15, use_dynamic_shifting=True, time_shift_type="exponential")


def tiny_qwen3_vl(staging: Path):
    """(tokenizer, Qwen3VLModel), both tiny; the tokenizer written to staging/tokenizer."""
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLModel

    folder = staging / "tokenizer"
    # The pipeline pads every prompt to 512 tokens after the template's prefix.
    ids = write_tiny_qwen2_tokenizer(folder, 2048, VISION_TOKENS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vision_ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id",
                           "video_token_id"), tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    # Two heads of 16: mrope's interleaved sections cover 8 frequencies.
    text = dict(vocab_size=ids["vocab_size"], hidden_size=TEXT_WIDTH, intermediate_size=48,
                num_hidden_layers=len(TEXT_LAYERS), num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                 "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                pad_token_id=ids["pad_token_id"])
    vision = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2,
                  out_hidden_size=TEXT_WIDTH, deepstack_visual_indexes=[0],
                  num_position_embeddings=64)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **vision_ids)
    return tokenizer, Qwen3VLModel(config)


def build_krea2(staging: Path):
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler,
                           Krea2Pipeline, Krea2Transformer2DModel)

    tokenizer, text_encoder = tiny_qwen3_vl(staging)
    # Head 16 = the rope axes (frame, row, column); 2x2 packing of 16 latent channels = 64.
    transformer = Krea2Transformer2DModel(
        in_channels=64, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, timestep_embed_dim=32,
        text_hidden_dim=TEXT_WIDTH, num_text_layers=len(TEXT_LAYERS),
        text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=48,
        num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6))
    # Three spatial downsamplings (8x) as the real one; its latents_mean/std are the defaults.
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True])
    return Krea2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**KREA2_SCHEDULER), vae=vae,
                         text_encoder=text_encoder, tokenizer=tokenizer,
                         transformer=transformer, text_encoder_select_layers=TEXT_LAYERS)
