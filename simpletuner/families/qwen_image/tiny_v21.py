"""The tiny Qwen-Image 2.1: QwenImage21Pipeline's own classes (a two-block
QwenImage21Transformer2DModel, a small 64-channel AutoencoderKLQwenImage21 with 16x
compression and its real latent statistics, a Qwen3-VL text encoder with tiny text and vision
towers) and its processor, around a byte-level Qwen2 tokenizer written locally with a Qwen3-VL
style chat template (text and image content items)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.tokenizers import write_tiny_qwen2_tokenizer

TEXT_WIDTH = 32
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
# Qwen3-VL's chat layout: a message's content is a string or a list of text and image items.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for item in message['content'] %}{%- if item['type'] == 'text' %}{{- item['text'] }}"
    "{%- else %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# The published Qwen-Image scheduler's resolution-dependent (exponential) shift.
SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9,
                 shift=1.0, shift_terminal=0.02, time_shift_type="exponential",
                 use_dynamic_shifting=True)


def tiny_qwen3_vl(staging: Path):
    """(processor, Qwen3VLForConditionalGeneration), both tiny; the tokenizer written to
    staging/processor."""
    from transformers import Qwen2Tokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    from simpletuner.families.qwen_image.v21_processor import ImageTextQwen3VLProcessor

    folder = staging / "processor"
    ids = write_tiny_qwen2_tokenizer(folder, 2048, VISION_TOKENS, chat_template=CHAT_TEMPLATE)
    tokenizer = Qwen2Tokenizer.from_pretrained(folder)
    vision_ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id",
                           "video_token_id"), tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    # Two heads of 16: mrope's interleaved sections cover 8 frequencies.
    text = dict(vocab_size=ids["vocab_size"], hidden_size=TEXT_WIDTH, intermediate_size=48,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                 "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                pad_token_id=ids["pad_token_id"])
    vision = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=16,
                  out_hidden_size=TEXT_WIDTH, deepstack_visual_indexes=[0],
                  num_position_embeddings=64)
    encoder = Qwen3VLForConditionalGeneration(
        Qwen3VLConfig(text_config=text, vision_config=vision, **vision_ids))
    # The text encoder sees a condition image at most 64 x 64 (16 patches of 16).
    image = Qwen2VLImageProcessorPil(patch_size=16, size={"shortest_edge": 32 * 32,
                                                          "longest_edge": 64 * 64})
    return ImageTextQwen3VLProcessor(image, tokenizer, chat_template=CHAT_TEMPLATE), encoder


def build_qwen_image_v21(staging: Path):
    from diffusers import (AutoencoderKLQwenImage21, FlowMatchEulerDiscreteScheduler,
                           QwenImage21Pipeline, QwenImage21Transformer2DModel)

    from simpletuner.families.qwen_image.v21_processor import PIPELINE_ENTRY

    processor, text_encoder = tiny_qwen3_vl(staging)
    # Head 16 = the rope axes (frame, row, column); 64 latent channels, unpatched.
    transformer = QwenImage21Transformer2DModel(
        in_channels=64, out_channels=64, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, context_in_dim=TEXT_WIDTH, mlp_ratio=2, axes_dims_rope=(4, 6, 6))
    # Four spatial downsamplings (16x) as the real one.
    vae = AutoencoderKLQwenImage21(base_dim=8, decoder_base_dim=8, z_dim=64,
                                   dim_mult=[1, 2, 2, 2, 2], num_res_blocks=1,
                                   temperal_downsample=[False, True, True, True])
    pipeline = QwenImage21Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
                                   vae=vae, text_encoder=text_encoder, processor=processor,
                                   transformer=transformer)
    pipeline.register_to_config(processor=PIPELINE_ENTRY)  # what its folder holds
    return pipeline
