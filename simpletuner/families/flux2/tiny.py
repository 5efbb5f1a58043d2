"""The tiny FLUX.2 model, klein's layout (Flux2KleinPipeline: Qwen3 text encoder, Qwen2
tokenizer). FLUX.2-dev's layout cannot be built here: its tokenizer is a PixtralProcessor, which
transformers imports only with torchvision, and this project does not depend on torchvision."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.tokenizers import QWEN3_CHAT_TEMPLATE, write_tiny_qwen2_tokenizer

TEXT_WIDTH = 16
TEXT_LAYERS = 27  # klein stacks hidden states 9, 18 and 27: the encoder needs 27 layers
MAX_LENGTH = 512  # the pipeline's max_sequence_length


def _qwen3_encoder(staging: Path):
    from transformers import Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

    folder = staging / "tokenizer"
    ids = write_tiny_qwen2_tokenizer(folder, MAX_LENGTH, ("<think>", "</think>"),
                                     chat_template=QWEN3_CHAT_TEMPLATE)
    tokenizer = Qwen2Tokenizer.from_pretrained(folder)
    config = Qwen3Config(hidden_size=TEXT_WIDTH, intermediate_size=32,
                         num_hidden_layers=TEXT_LAYERS, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8, max_position_embeddings=MAX_LENGTH,
                         tie_word_embeddings=True, **ids)
    return tokenizer, Qwen3ForCausalLM(config)


def _vae():
    import torch
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(in_channels=3, out_channels=3, layers_per_block=1,
                             block_out_channels=(8, 16, 32, 32), latent_channels=8,
                             norm_num_groups=8, sample_size=64)
    # Running statistics away from (0, 1), so the latent normalisation is not an identity.
    channels = vae.bn.running_mean.shape[0]
    vae.bn.running_mean.copy_(0.1 * torch.randn(channels))
    vae.bn.running_var.copy_(0.5 + torch.rand(channels))
    return vae


def build_flux2_klein(staging: Path):
    from diffusers import (FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                           Flux2Transformer2DModel)

    tokenizer, text_encoder = _qwen3_encoder(staging)
    vae = _vae()
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=4 * vae.config.latent_channels, num_layers=1,
        num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=3 * TEXT_WIDTH, timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=False)
    # FLUX.2's scheduler: resolution-dependent (exponential) shift.
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")
    return Flux2KleinPipeline(transformer=transformer, scheduler=scheduler, vae=vae,
                              text_encoder=text_encoder, tokenizer=tokenizer, is_distilled=False)
