"""The tiny Z-Image model: ZImagePipeline's own classes (ZImageTransformer2DModel, the
Flux-style 16-channel VAE, a Qwen3 text encoder whose second-to-last hidden states the pipeline
reads) at toy widths, with a byte-level Qwen tokenizer carrying a Qwen3-style chat template."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import flow_vae
from simpletuner.models.tiny.tokenizers import QWEN3_CHAT_TEMPLATE, write_tiny_qwen2_tokenizer

TOKEN_LENGTH = 512  # ZImagePipeline's max_sequence_length
TEXT_WIDTH = 32


def build_z_image(staging: Path):
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    ids = write_tiny_qwen2_tokenizer(staging / "tokenizer", TOKEN_LENGTH,
                                     chat_template=QWEN3_CHAT_TEMPLATE)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=TEXT_WIDTH, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=TOKEN_LENGTH, **ids))
    # Two heads of 16 = the rotary axes' 4 + 6 + 6; the caption axis must reach past 512 tokens.
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2,
        n_refiner_layers=1, n_heads=2, n_kv_heads=2, cap_feat_dim=TEXT_WIDTH,
        axes_dims=[4, 6, 6], axes_lens=[1536, 64, 64])
    # Like Z-Image-Turbo's scheduler: a fixed shift of 3.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0,
                                                use_dynamic_shifting=False)
    return ZImagePipeline(scheduler=scheduler, vae=flow_vae(0.3611, 0.1159),
                          text_encoder=text_encoder,
                          tokenizer=AutoTokenizer.from_pretrained(staging / "tokenizer"),
                          transformer=transformer)
