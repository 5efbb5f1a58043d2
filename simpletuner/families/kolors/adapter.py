"""Kolors: SDXL's UNet conditioning (sdxl/adapter.py) on ChatGLM3's penultimate hidden states
(256 tokens, padded on the left) and, as the pooled embedding, the last state of the final
token, read through KolorsPipeline's own encode_prompt; the UNet projects the states to its
cross-attention width (text_proj)."""

from __future__ import annotations

import torch
from diffusers import KolorsPipeline
from diffusers.pipelines.kolors import ChatGLMModel, ChatGLMTokenizer

from simpletuner.families.sdxl.adapter import SDXLAdapter


class KolorsAdapter(SDXLAdapter):
    family = "kolors"
    text_encoder_specs = (("text_encoder", "tokenizer", ChatGLMModel, ChatGLMTokenizer),)
    pipeline_class = KolorsPipeline
    forbidden_subfolders = ("transformer", "text_encoder_2")  # SD3, Flux; SDXL
    max_sequence_length = 256  # KolorsPipeline's default

    def _text_pipeline(self) -> KolorsPipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(vae=None, unet=None, scheduler=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 256, hidden], "pooled_prompt_embeds": [B, hidden]}: the
        pipeline's encode_prompt without the negative pass."""
        embeds, _, pooled, _ = self._text_pipeline().encode_prompt(
            prompts, device=self.device, do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length)
        return {"prompt_embeds": embeds, "pooled_prompt_embeds": pooled}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """Always 256 tokens: every prompt is padded to max_sequence_length."""
        width = self.text_encoders[0].config.hidden_size
        return {"prompt_embeds": torch.empty(count, self.max_sequence_length, width,
                                             device=self.device),
                "pooled_prompt_embeds": torch.empty(count, width, device=self.device)}

    def _pipeline_options(self) -> dict:
        return {}  # KolorsPipeline has no watermarker
