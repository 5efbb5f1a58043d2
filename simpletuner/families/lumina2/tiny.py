"""The tiny Lumina 2 model: Lumina2Pipeline's own classes (Lumina2Transformer2DModel, the
Flux-style 16-channel VAE, a Gemma2 text encoder whose second-to-last hidden states the pipeline
reads) at toy widths, with a Gemma tokenizer written locally: one token per printable ASCII
character, every other byte through Gemma's byte fallback."""

from __future__ import annotations

import string
from pathlib import Path

from simpletuner.models.tiny.parts import flow_vae

TOKEN_LENGTH = 256  # Lumina2Pipeline's max_sequence_length
TEXT_WIDTH = 32
# Gemma's layout of its special tokens
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")


def write_tiny_gemma_tokenizer(folder: Path) -> dict[str, int]:
    """Save a GemmaTokenizer (tokenizer.json, loads offline with from_pretrained) with no
    merges; return the ids a Gemma2 config needs."""
    from transformers import GemmaTokenizer

    pieces = (list(SPECIAL_TOKENS) + [f"<0x{byte:02X}>" for byte in range(256)] + ["▁"]
              + [c for c in string.printable if not c.isspace()])
    vocab = {piece: index for index, piece in enumerate(pieces)}
    tokenizer = GemmaTokenizer(vocab=vocab, model_max_length=TOKEN_LENGTH)
    tokenizer.save_pretrained(folder)
    return {"vocab_size": len(vocab), "pad_token_id": vocab["<pad>"],
            "eos_token_id": vocab["<eos>"], "bos_token_id": vocab["<bos>"]}


def build_lumina2(staging: Path):
    from diffusers import (FlowMatchEulerDiscreteScheduler, Lumina2Pipeline,
                           Lumina2Transformer2DModel)
    from transformers import AutoTokenizer, Gemma2Config, Gemma2Model

    ids = write_tiny_gemma_tokenizer(staging / "tokenizer")
    text_encoder = Gemma2Model(Gemma2Config(
        hidden_size=TEXT_WIDTH, intermediate_size=37, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=TOKEN_LENGTH, sliding_window=TOKEN_LENGTH, **ids))
    # Two heads of 16 = the rotary axes' 4 + 6 + 6; the caption axis must reach past 256 tokens.
    transformer = Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, hidden_size=32, num_layers=2,
        num_refiner_layers=1, num_attention_heads=2, num_kv_heads=1, multiple_of=16,
        axes_dim_rope=(4, 6, 6), axes_lens=(300, 64, 64), cap_feat_dim=TEXT_WIDTH)
    # Like Lumina-Image-2.0's scheduler: a fixed shift of 6.
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=6.0)
    return Lumina2Pipeline(scheduler=scheduler, vae=flow_vae(0.3611, 0.1159),
                           text_encoder=text_encoder,
                           tokenizer=AutoTokenizer.from_pretrained(staging / "tokenizer"),
                           transformer=transformer)
