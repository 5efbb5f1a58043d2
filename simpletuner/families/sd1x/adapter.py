"""Stable Diffusion 1.x: one CLIP text encoder, its last hidden state conditions the UNet."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionPipeline
from transformers import CLIPTextModel, CLIPTokenizer

from simpletuner.models.unet_family import UNetFamilyAdapter


class SD1xAdapter(UNetFamilyAdapter):
    family = "sd1x"
    text_encoder_specs = (("text_encoder", "tokenizer", CLIPTextModel, CLIPTokenizer),)
    pipeline_class = StableDiffusionPipeline
    forbidden_subfolders = ("text_encoder_2", "transformer")  # SDXL, SD3 or Flux

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, tokens, hidden]}."""
        ids = self._token_ids(self.tokenizers[0], prompts)
        return {"prompt_embeds": self.text_encoders[0](ids, return_dict=False)[0]}

    def _pipeline_options(self) -> dict:
        # Validation images of a fine-tune are for the user's eyes; no safety checker is loaded.
        return {"safety_checker": None, "feature_extractor": None,
                "requires_safety_checker": False}
