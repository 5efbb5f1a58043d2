"""SDXL: two CLIP text encoders (penultimate hidden states concatenated, pooled embedding of
the second) and micro-conditioning on each sample's original size, crop and target size."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionXLPipeline
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device
from simpletuner.models.unet_family import UNetFamilyAdapter


def add_time_ids(batch: TrainingBatch) -> torch.Tensor:
    """[B, 6] rows of (original h, w, crop top, left, target h, w), SDXL's micro-conditioning."""
    count = batch.latents.shape[0]
    geometry = (batch.original_sizes, batch.crop_top_lefts, batch.target_sizes)
    if any(len(values) != count for values in geometry):
        raise ValueError(f"SDXL batch of {count} latents has {len(batch.original_sizes)} "
                         f"original sizes, {len(batch.crop_top_lefts)} crops and "
                         f"{len(batch.target_sizes)} target sizes; each sample needs all three")
    rows = [list(original) + list(crop) + list(target)
            for original, crop, target in zip(*geometry)]
    return torch.tensor(rows, dtype=torch.float32)


class SDXLAdapter(UNetFamilyAdapter):
    family = "sdxl"
    text_encoder_specs = (
        ("text_encoder", "tokenizer", CLIPTextModel, CLIPTokenizer),
        ("text_encoder_2", "tokenizer_2", CLIPTextModelWithProjection, CLIPTokenizer))
    pipeline_class = StableDiffusionXLPipeline
    vae_float32_under_fp16 = True

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, tokens, hidden_1 + hidden_2],
        "pooled_prompt_embeds": [B, projection_2]}."""
        outputs = [encoder(self._token_ids(tokenizer, prompts), output_hidden_states=True)
                   for encoder, tokenizer in zip(self.text_encoders, self.tokenizers)]
        return {"prompt_embeds": torch.cat([out.hidden_states[-2] for out in outputs], dim=-1),
                "pooled_prompt_embeds": outputs[-1].text_embeds}

    def _unet_conditioning(self, batch: TrainingBatch, dtype: torch.dtype) -> dict:
        embeds = batch.prompt_embeds
        return {"encoder_hidden_states": embeds["prompt_embeds"].to(dtype),
                "added_cond_kwargs": {
                    "text_embeds": embeds["pooled_prompt_embeds"].to(dtype),
                    "time_ids": to_device(add_time_ids(batch), self.device).to(dtype)}}

    def _pipeline_options(self) -> dict:
        # Invisible watermarks would make validation images differ from what the model made.
        return {"add_watermarker": False}
