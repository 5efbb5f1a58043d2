"""The tiny Ideogram 4: Ideogram4Pipeline's own classes (two two-block
Ideogram4Transformer2DModels, conditional and unconditional, the FLUX.2 VAE, a Qwen3VLModel
deep enough for the thirteen layers the pipeline taps, at width 16) with a byte-level Qwen2
tokenizer written locally whose chat template reads Qwen3-VL's content items."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import flux2_vae
from simpletuner.models.tiny.tokenizers import write_tiny_qwen2_tokenizer

TEXT_WIDTH = 16
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    "{%- for item in message['content'] %}{{- item['text'] }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def tiny_qwen3_vl(staging: Path, layers: int):
    """(tokenizer, Qwen3VLModel of ``layers`` decoder layers), the tokenizer written to
    staging/tokenizer."""
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLModel

    folder = staging / "tokenizer"
    ids = write_tiny_qwen2_tokenizer(folder, 4096, VISION_TOKENS, chat_template=CHAT_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vision_ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id",
                           "video_token_id"), tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    text = dict(vocab_size=ids["vocab_size"], hidden_size=TEXT_WIDTH, intermediate_size=24,
                num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                head_dim=8, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                pad_token_id=ids["pad_token_id"])
    vision = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2,
                  out_hidden_size=TEXT_WIDTH, deepstack_visual_indexes=[0],
                  num_position_embeddings=64)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **vision_ids)
    return tokenizer, Qwen3VLModel(config)


def build_ideogram(staging: Path):
    from diffusers import (FlowMatchEulerDiscreteScheduler, Ideogram4Pipeline,
                           Ideogram4Transformer2DModel)
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import QWEN3_VL_ACTIVATION_LAYERS

    tokenizer, text_encoder = tiny_qwen3_vl(staging, max(QWEN3_VL_ACTIVATION_LAYERS) + 1)
    vae = flux2_vae()

    def transformer():
        # Heads of 16: mrope's interleaved (t, h, w) sections cover its 8 frequencies.
        return Ideogram4Transformer2DModel(
            in_channels=4 * vae.config.latent_channels, num_layers=2, attention_head_dim=16,
            num_attention_heads=2, intermediate_size=64, adaln_dim=16,
            llm_features_dim=len(QWEN3_VL_ACTIVATION_LAYERS) * TEXT_WIDTH,
            mrope_section=(2, 2, 2))

    return Ideogram4Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                             text_encoder=text_encoder, tokenizer=tokenizer,
                             transformer=transformer(), unconditional_transformer=transformer())
