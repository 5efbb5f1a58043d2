"""Stable Diffusion 3: CLIP-L and CLIP-G (penultimate hidden states side by side, pooled
embeddings concatenated) plus T5, whose tokens follow the CLIP tokens; the transformer takes
the timestep as sigma * num_train_timesteps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextModelWithProjection, CLIPTokenizer, T5EncoderModel, T5Tokenizer

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


class SD3Adapter(FlowFamilyAdapter):
    family = "sd3"
    text_encoder_specs = (
        ("text_encoder", "tokenizer", CLIPTextModelWithProjection, CLIPTokenizer),
        ("text_encoder_2", "tokenizer_2", CLIPTextModelWithProjection, CLIPTokenizer),
        ("text_encoder_3", "tokenizer_3", T5EncoderModel, T5Tokenizer))
    transformer_class = SD3Transformer2DModel
    pipeline_class = StableDiffusion3Pipeline
    t5_max_length = 256

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 77 + T5 tokens, T5 width],
        "pooled_prompt_embeds": [B, projection_L + projection_G]}, as the pipeline builds them."""
        clip_hidden, clip_pooled = [], []
        for encoder, tokenizer in zip(self.text_encoders[:2], self.tokenizers[:2]):
            ids = self._token_ids(tokenizer, prompts)
            output = encoder(ids, output_hidden_states=True)
            clip_hidden.append(output.hidden_states[-2])
            clip_pooled.append(output.text_embeds)
        t5 = self.text_encoders[2](self._t5_ids(self.tokenizers[2], prompts))[0]
        clip = torch.cat(clip_hidden, dim=-1)
        clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))  # zero-pad to the T5 width
        return {"prompt_embeds": torch.cat([clip, t5.to(clip.dtype)], dim=-2),
                "pooled_prompt_embeds": torch.cat(clip_pooled, dim=-1)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        timesteps = sigmas * self.scheduler.config.num_train_timesteps
        return network(hidden_states=noisy, timestep=timesteps.to(dtype),
                       encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
                       pooled_projections=embeds["pooled_prompt_embeds"].to(dtype),
                       return_dict=False)[0]
