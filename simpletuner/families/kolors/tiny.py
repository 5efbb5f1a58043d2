"""The tiny Kolors model: KolorsPipeline's own classes (an SDXL-style UNet whose text_proj maps
the ChatGLM hidden states to its cross-attention width, ChatGLMModel, ChatGLMTokenizer) at toy
widths, on an untrained 8x KL VAE with SDXL's scaling factor (the pretrained one of sd_vae.py
costs its training in every process that builds it). ChatGLMTokenizer reads a
sentencepiece model; one is trained here on a small corpus, so nothing is downloaded."""

from __future__ import annotations

import io
from pathlib import Path

from simpletuner.models.tiny.parts import tiny_kl_vae
from simpletuner.models.tiny.unet_models import tiny_unet

TEXT_WIDTH = 32
# Kolors' prompts are padded to 256 tokens (KolorsPipeline's max_sequence_length).
TEXT_POSITIONS = 256
CORPUS = ("a red circle on a blue background", "a small blue square standing on a long table",
          "a green triangle at dusk", "shapes of every colour, large and small",
          "a photo of a cat and a dog in the garden", "an empty room with white walls",
          "the quick brown fox jumps over the lazy dog", "numbers 0 1 2 3 4 5 6 7 8 9",
          "yellow, purple, orange, black and grey circles")


def write_chatglm_tokenizer(folder: Path) -> int:
    """A sentencepiece model (unk 0, bos 1, eos 2; characters it never saw fall back to their
    bytes) as ChatGLMTokenizer's tokenizer.model in ``folder``; returns its vocabulary size."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=400, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, num_threads=1, hard_vocab_limit=False,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return sentencepiece.SentencePieceProcessor(model_proto=model.getvalue()).vocab_size()


def tiny_chatglm(vocabulary: int):
    """ChatGLM3's layout (grouped-query attention, biased QKV, original RoPE) at toy widths,
    initialised: its default (empty_init) leaves the weights as torch.empty made them, and its
    RMSNorm weights stay empty either way."""
    import torch
    from diffusers.pipelines.kolors import ChatGLMModel
    from diffusers.pipelines.kolors.text_encoder import ChatGLMConfig, RMSNorm

    # ChatGLM's special tokens (gMASK, sop...) follow the sentencepiece pieces.
    model = ChatGLMModel(ChatGLMConfig(
        num_layers=2, padded_vocab_size=vocabulary + 16, hidden_size=TEXT_WIDTH,
        ffn_hidden_size=37, kv_channels=8, num_attention_heads=4, seq_length=TEXT_POSITIONS,
        multi_query_attention=True, multi_query_group_num=2, add_qkv_bias=True,
        original_rope=True), empty_init=False)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
    return model


def build_kolors(staging: Path):
    from diffusers import EulerDiscreteScheduler, KolorsPipeline
    from diffusers.pipelines.kolors import ChatGLMTokenizer

    vocabulary = write_chatglm_tokenizer(staging / "tokenizer")
    tokenizer = ChatGLMTokenizer(str(staging / "tokenizer" / "tokenizer.model"))
    text_encoder = tiny_chatglm(vocabulary)
    time_embed_dim = 8
    unet = tiny_unet(
        cross_attention_dim=32, attention_head_dim=(2, 4), use_linear_projection=True,
        encoder_hid_dim=TEXT_WIDTH, encoder_hid_dim_type="text_proj",
        addition_embed_type="text_time", addition_time_embed_dim=time_embed_dim,
        # six micro-conditioning numbers, each embedded, plus the pooled ChatGLM state
        projection_class_embeddings_input_dim=6 * time_embed_dim + TEXT_WIDTH)
    # Kwai-Kolors/Kolors-diffusers' scheduler: 1100 training steps, betas up to 0.014.
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1100, beta_start=0.00085, beta_end=0.014,
        beta_schedule="scaled_linear", timestep_spacing="leading", steps_offset=1)
    return KolorsPipeline(vae=tiny_kl_vae(0.13025), text_encoder=text_encoder,
                          tokenizer=tokenizer, unet=unet, scheduler=scheduler,
                          force_zeros_for_empty_prompt=False)
