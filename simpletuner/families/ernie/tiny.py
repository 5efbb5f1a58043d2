"""The tiny ERNIE-Image: ErnieImagePipeline's own classes (ErnieImageTransformer2DModel with two
blocks, the FLUX.2 VAE, a two-layer Mistral3Model whose second-to-last hidden states the
pipeline reads) at toy widths, with a Llama-style tokenizer written locally: one token per
printable ASCII character, every other byte through byte fallback, a BOS token first as the
pipeline's add_special_tokens asks."""

from __future__ import annotations

import string
from pathlib import Path

from simpletuner.models.tiny.parts import flux2_vae

TEXT_WIDTH = 24  # not the transformer's width, so its text projection exists as in the real one
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def write_tiny_llama_tokenizer(folder: Path) -> dict[str, int]:
    """Save a LlamaTokenizer (tokenizer.json, loads offline with AutoTokenizer) with no merges;
    return the ids a Mistral config needs."""
    from transformers import LlamaTokenizer

    pieces = (list(SPECIAL_TOKENS) + [f"<0x{byte:02X}>" for byte in range(256)] + ["▁"]
              + [c for c in string.printable if not c.isspace()])
    vocab = {piece: index for index, piece in enumerate(pieces)}
    LlamaTokenizer(vocab=vocab, merges=[], add_bos_token=True).save_pretrained(folder)
    return {"vocab_size": len(vocab), "bos_token_id": vocab["<s>"],
            "eos_token_id": vocab["</s>"]}


def tiny_mistral3(staging: Path):
    """(tokenizer, Mistral3Model), both tiny; the tokenizer written to staging/tokenizer."""
    from transformers import AutoTokenizer, Mistral3Config, Mistral3Model

    ids = write_tiny_llama_tokenizer(staging / "tokenizer")
    text = dict(model_type="mistral", hidden_size=TEXT_WIDTH, intermediate_size=32,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=12,
                max_position_embeddings=1024, sliding_window=None, **ids)
    vision = dict(model_type="pixtral", hidden_size=16, intermediate_size=24,
                  num_hidden_layers=1, num_attention_heads=2, head_dim=8, image_size=32,
                  patch_size=8)
    config = Mistral3Config(text_config=text, vision_config=vision, image_token_index=0)
    return AutoTokenizer.from_pretrained(staging / "tokenizer"), Mistral3Model(config)


def build_ernie(staging: Path):
    import torch
    from diffusers import (ErnieImagePipeline, ErnieImageTransformer2DModel,
                           FlowMatchEulerDiscreteScheduler)

    tokenizer, text_encoder = tiny_mistral3(staging)
    vae = flux2_vae()
    channels = 4 * vae.config.latent_channels  # the pipeline's 2x2 patchify
    # Two heads of 16 = the rope axes (text position, row, column) 4 + 6 + 6.
    transformer = ErnieImageTransformer2DModel(
        hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=64,
        in_channels=channels, out_channels=channels, text_in_dim=TEXT_WIDTH,
        rope_axes_dim=(4, 6, 6))
    # The class zero-initialises its modulation and output layers, which a trained model's are
    # not: as zeros every block's gate would stop the gradients a LoRA needs.
    generator = torch.Generator().manual_seed(1)
    for layer in (transformer.adaLN_modulation[-1], transformer.final_linear):
        layer.weight.data.copy_(0.05 * torch.randn(layer.weight.shape, generator=generator))
    # The pipeline sets its own sigmas and no mu: a fixed shift.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    return ErnieImagePipeline(transformer=transformer, vae=vae, text_encoder=text_encoder,
                              tokenizer=tokenizer, scheduler=scheduler)
