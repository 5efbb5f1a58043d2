"""The tiny HiDream-I1 model: HiDreamImagePipeline's own classes at toy widths (the MoE
transformer with one double- and one single-stream block, four routed experts of which two
are active, two CLIP encoders with projections, T5, a Llama), the untrained Flux-like VAE,
tokenizers written locally (the Llama one is the byte-level Qwen2 tokenizer, loaded as the
PreTrainedTokenizerFast the pipeline names). Its max_resolution of 16 latent patches a side
(HiDream's is 128) is the area the adapter's pipeline generates at (adapter.build_pipeline):
128 px images instead of 1 MP ones."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.tiny.parts import flow_vae, tiny_t5
from simpletuner.models.tiny.tokenizers import (write_tiny_qwen2_tokenizer,
                                                 write_tiny_tokenizer_files)

# HiDreamImagePipeline pads CLIP prompts to min(max_sequence_length, 218) = 128 tokens (its
# real CLIP encoders have 248 positions); T5 and Llama to their tokenizers' lengths.
CLIP_POSITIONS = 128
LLAMA_TOKENS = 32
T5_WIDTH, LLAMA_WIDTH, CLIP_PROJECTION = 32, 16, 16


def tiny_clip(staging: Path, subfolder: str):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, CLIPTokenizer

    ids = write_tiny_tokenizer_files(staging / subfolder, CLIP_POSITIONS)
    config = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4,
                            num_hidden_layers=2, max_position_embeddings=CLIP_POSITIONS,
                            projection_dim=CLIP_PROJECTION, hidden_act="gelu", **ids)
    return CLIPTokenizer.from_pretrained(staging / subfolder), CLIPTextModelWithProjection(config)


def tiny_llama(staging: Path, subfolder: str):
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    ids = write_tiny_qwen2_tokenizer(staging / subfolder, LLAMA_TOKENS)
    config = LlamaConfig(hidden_size=LLAMA_WIDTH, intermediate_size=37, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                         max_position_embeddings=LLAMA_TOKENS, **ids)
    return PreTrainedTokenizerFast.from_pretrained(staging / subfolder), LlamaForCausalLM(config)


def build_hidream(staging: Path):
    from diffusers import (FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline,
                           HiDreamImageTransformer2DModel)

    tokenizer, text_encoder = tiny_clip(staging, "tokenizer")
    tokenizer_2, text_encoder_2 = tiny_clip(staging, "tokenizer_2")
    tokenizer_3, text_encoder_3 = tiny_t5(staging, "tokenizer_3", T5_WIDTH)
    tokenizer_4, text_encoder_4 = tiny_llama(staging, "tokenizer_4")
    transformer = HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=16, num_layers=1, num_single_layers=1,
        attention_head_dim=8, num_attention_heads=4, caption_channels=[T5_WIDTH, LLAMA_WIDTH],
        text_emb_dim=2 * CLIP_PROJECTION, num_routed_experts=4, num_activated_experts=2,
        axes_dims_rope=(4, 2, 2), max_resolution=(16, 16), llama_layers=[0, 1])
    # HiDream-I1-Full's scheduler: flow matching shifted by 3.
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return HiDreamImagePipeline(
        scheduler=scheduler, vae=flow_vae(0.3611, 0.1159), text_encoder=text_encoder,
        tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3, text_encoder_4=text_encoder_4,
        tokenizer_4=tokenizer_4, transformer=transformer)
