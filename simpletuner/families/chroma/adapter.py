"""Chroma (lodestones/Chroma1-HD, Chroma1-Base): a pruned FLUX.1-schnell. The transformer sees
Flux's packed 2x2 latents and (0, row, column) ids, the timestep as sigma, and the T5 hidden
states of one encoder with ChromaPipeline's attention mask: every real token and the first
padding token, extended over the image tokens. There is no pooled embedding and no guidance
input (its approximator is fed guidance 0 inside the transformer); guidance is real
classifier-free guidance at inference, so training sees the prompt alone."""

from __future__ import annotations

from functools import partial

import torch
from diffusers import ChromaPipeline, ChromaTransformer2DModel
from torch.utils.checkpoint import checkpoint
from transformers import T5EncoderModel, T5Tokenizer

from simpletuner.models.checkpointing import EveryNthBlock
from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


def prompt_attention_mask(token_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, T] in ``dtype``: 1 for the real tokens and the first padding token, as
    ChromaPipeline._get_t5_prompt_embeds builds it."""
    lengths = token_mask.sum(dim=1, keepdim=True)
    positions = torch.arange(token_mask.shape[1], device=token_mask.device)[None, :]
    return (positions <= lengths).to(dtype)


class ChromaAdapter(FlowFamilyAdapter):
    family = "chroma"
    text_encoder_specs = (("text_encoder", "tokenizer", T5EncoderModel, T5Tokenizer),)
    transformer_class = ChromaTransformer2DModel
    pipeline_class = ChromaPipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families; SD3 and Flux (CLIP + T5)
    # SimpleTuner's Chroma default, less to_qkv (it exists only once projections are fused).
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")
    t5_max_length = 512  # ChromaPipeline's max_sequence_length, whatever the tokenizer says

    @property
    def latent_patch(self) -> int:
        return 2  # the 2x2 packing (the transformer's own patch_size is 1)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 512, T5 width], "prompt_attention_mask": [B, 512]}: T5 run
        with the tokenizer's mask, then the mask the transformer gets."""
        tokens = self.tokenizers[0](prompts, padding="max_length", max_length=self.t5_max_length,
                                    truncation=True, return_tensors="pt")
        token_mask = tokens.attention_mask.to(self.device)
        embeds = self.text_encoders[0](tokens.input_ids.to(self.device),
                                       attention_mask=token_mask)[0]
        return {"prompt_embeds": embeds,
                "prompt_attention_mask": prompt_attention_mask(token_mask, embeds.dtype)}

    def set_gradient_checkpointing(self, enabled: bool, interval: int = 1) -> None:
        """Each ``interval``-th block's forward under torch's checkpoint. Not diffusers' own: in
        0.42.1 its checkpointed single blocks are called without the attention mask."""
        every_nth = EveryNthBlock(self.transformer, interval)
        for block in (*self.transformer.transformer_blocks,
                      *self.transformer.single_transformer_blocks):
            block.__dict__.pop("forward", None)
            if enabled and every_nth.checkpointed(block):
                block.forward = partial(checkpoint, type(block).forward.__get__(block),
                                        use_reentrant=False)

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        count, channels, height, width = noisy.shape
        embeds = batch.prompt_embeds
        prompt_embeds = embeds["prompt_embeds"].to(dtype)
        packed = ChromaPipeline._pack_latents(noisy, count, channels, height, width)
        # As ChromaPipeline._prepare_attention_mask: the image tokens are never masked, and the
        # mask stays float 0/1 (SDPA adds it to the scores), not bool, as inference sees it.
        image_tokens = torch.ones(count, packed.shape[1], device=self.device, dtype=torch.bool)
        mask = torch.cat([embeds["prompt_attention_mask"].to(dtype), image_tokens], dim=1)
        tokens = network(
            hidden_states=packed, timestep=sigmas.to(dtype), encoder_hidden_states=prompt_embeds,
            txt_ids=torch.zeros(prompt_embeds.shape[1], 3, device=self.device, dtype=dtype),
            img_ids=ChromaPipeline._prepare_latent_image_ids(count, height // 2, width // 2,
                                                             self.device, dtype),
            attention_mask=mask, return_dict=False)[0]
        return ChromaPipeline._unpack_latents(tokens, height * self.vae_factor,
                                              width * self.vae_factor, self.vae_factor)
