"""Lumina 2 (Alpha-VLLM/Lumina-Image-2.0): a Gemma2 text encoder read through Lumina2Pipeline's
own encode_prompt (its system prompt before "<Prompt Start>", second-to-last hidden states, the
tokenizer's mask over 256 tokens), the Flux VAE (16 channels, shifted and scaled), and a
transformer that patchifies the latents itself, takes the timestep as 1 - sigma (0 is pure
noise) and predicts latents - noise: the pipeline negates its output before the scheduler
step."""

from __future__ import annotations

import torch
from diffusers import Lumina2Pipeline, Lumina2Transformer2DModel
from transformers import AutoTokenizer, Gemma2Model

from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


class Lumina2Adapter(FlowFamilyAdapter):
    family = "lumina2"
    text_encoder_specs = (("text_encoder", "tokenizer", Gemma2Model, AutoTokenizer),)
    transformer_class = Lumina2Transformer2DModel
    pipeline_class = Lumina2Pipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    # The attention projections of every block (refiners included), as for Z-Image.
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")
    max_sequence_length = 256  # Lumina2Pipeline's default

    @classmethod
    def swappable_blocks(cls, network: torch.nn.Module) -> list[torch.nn.Module]:
        """In the order the forward runs them, which is not the modules' own: the caption
        refiner, the image refiner, then the joint blocks."""
        return [*network.context_refiner, *network.noise_refiner, *network.layers]

    def _text_pipeline(self) -> Lumina2Pipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 256, width], "prompt_attention_mask": [B, 256]}: the pipeline's
        encode_prompt without the negative pass."""
        embeds, mask, _, _ = self._text_pipeline().encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length)
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """The tokens of the pipeline's system prompt and the caption, as the folder's
        tokenizer counts them, without the padding (_predict gives the meta device's mask,
        which has no values, as all ones)."""
        text = f"{self._text_pipeline().system_prompt} <Prompt Start> {PLANNED_CAPTION}"
        tokens = min(len(self.tokenizers[0](text).input_ids), self.max_sequence_length)
        width = self.text_encoders[0].config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_attention_mask": torch.ones(count, tokens, dtype=torch.long,
                                                    device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        # The transformer reads each caption's length from the mask's values (so it stays
        # integral); the memory plan's meta mask has none: its captions are unpadded.
        mask = embeds["prompt_attention_mask"]
        mask = torch.ones(mask.shape, dtype=torch.long) if mask.is_meta else mask.to(torch.long)
        # The pipeline's timestep: 1 - t / 1000 = 1 - sigma, i.e. 0 is pure noise.
        output = network(hidden_states=noisy, timestep=(1.0 - sigmas).to(dtype),
                         encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
                         encoder_attention_mask=mask, return_dict=False)[0]
        return -output
