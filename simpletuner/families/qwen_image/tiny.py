"""The tiny Qwen-Image: a two-block QwenImageTransformer2DModel, a small causal 3D VAE with the
real latent statistics, and a Qwen2.5-VL text encoder (tiny text and vision towers) with a
locally written byte-level Qwen2 tokenizer that knows Qwen's chat and vision tokens. The tiny
Qwen-Image-Edit is the same network in QwenImageEditPipeline, with the processor that shows
its text encoder the reference image."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.tokenizers import write_tiny_qwen2_tokenizer

TEXT_WIDTH = 32
# The ids Qwen2.5-VL's config names; the tokenizer appends them after the chat tokens.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# The published Qwen-Image scheduler: resolution-dependent (exponential) shift.
QWEN_IMAGE_SCHEDULER = dict(
    base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9, shift=1.0,
    shift_terminal=0.02, time_shift_type="exponential", use_dynamic_shifting=True)


def tiny_qwen25_vl(staging: Path, subfolder: str = "tokenizer"):
    """(Qwen2Tokenizer, Qwen2_5_VLForConditionalGeneration) both tiny, the tokenizer written to
    ``staging/subfolder``."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    # Room for the chat template (one token per byte here) plus a long prompt.
    ids = write_tiny_qwen2_tokenizer(staging / subfolder, 2048, VISION_TOKENS)
    tokenizer = Qwen2Tokenizer.from_pretrained(staging / subfolder)
    vision_ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id",
                           "video_token_id"), tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    # Two heads of 16: mrope's sections (time, height, width) cover half a head, 8 frequencies.
    text = dict(vocab_size=ids["vocab_size"], hidden_size=TEXT_WIDTH, intermediate_size=48,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                 "mrope_section": [2, 3, 3]},
                bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"],
                pad_token_id=ids["pad_token_id"])
    vision = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2,
                  out_hidden_size=TEXT_WIDTH, fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **vision_ids)
    return tokenizer, Qwen2_5_VLForConditionalGeneration(config)


def _qwen_image_parts(staging: Path) -> dict:
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler,
                           QwenImageTransformer2DModel)

    tokenizer, text_encoder = tiny_qwen25_vl(staging)
    # Head 16 = the rope axes (frame, row, column); 2x2 packing of 16 latent channels = 64.
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=TEXT_WIDTH, axes_dims_rope=(4, 6, 6))
    # Three spatial downsamplings (8x) as the real one; its latents_mean/std are the defaults.
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True])
    return dict(transformer=transformer, vae=vae, text_encoder=text_encoder,
                tokenizer=tokenizer,
                scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER))


def build_qwen_image(staging: Path):
    from diffusers import QwenImagePipeline

    return QwenImagePipeline(**_qwen_image_parts(staging))


def build_qwen_image_edit(staging: Path, pipeline_name: str = "QwenImageEditPipeline"):
    import diffusers

    from simpletuner.families.qwen_image.processor import PIPELINE_ENTRY, build_processor

    parts = _qwen_image_parts(staging)
    # The text encoder sees each reference at most 112 x 112 (64 patches of 14), not the real
    # processor's 1 MP: a few dozen image tokens keep the tiny model fast.
    processor = build_processor(parts["tokenizer"],
                                size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})
    pipeline = getattr(diffusers, pipeline_name)(processor=processor, **parts)
    pipeline.register_to_config(processor=PIPELINE_ENTRY)
    return pipeline


def build_qwen_image_edit_plus(staging: Path):
    """Qwen-Image-Edit-2509's layout: the same parts in QwenImageEditPlusPipeline."""
    return build_qwen_image_edit(staging, "QwenImageEditPlusPipeline")
