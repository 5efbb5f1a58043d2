"""Sana: a Gemma2 text encoder read through SanaPipeline's own encode_prompt (its complex
human instruction before the caption, the first token and the last 299 kept, with their
mask), the deep-compression autoencoder (latents scaled, not shifted), and a linear-attention
transformer on unpatched latents that predicts the velocity noise - latents at timestep
1000 * sigma, as SanaPipeline steps its flow-sigma DPM-Solver++ scheduler."""

from __future__ import annotations

import inspect

import torch
from diffusers import (AutoencoderDC, DPMSolverMultistepScheduler, SanaPipeline,
                       SanaTransformer2DModel)
from transformers import AutoTokenizer, Gemma2Model

from simpletuner.models.flow_family import FLOW_TIMESTEPS, FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


class SanaAdapter(FlowFamilyAdapter):
    family = "sana"
    text_encoder_specs = (("text_encoder", "tokenizer", Gemma2Model, AutoTokenizer),)
    transformer_class = SanaTransformer2DModel
    pipeline_class = SanaPipeline
    vae_class = AutoencoderDC
    scheduler_class = DPMSolverMultistepScheduler  # flow sigmas, as Sana's folders ship it
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    # SimpleTuner's default: the self- and cross-attention projections of every block.
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")
    max_sequence_length = 300  # SanaPipeline's default

    @property
    def vae_factor(self) -> int:
        return 2 ** (len(self.vae.config.encoder_block_out_channels) - 1)

    def sigma_shift(self, latent_height: int, latent_width: int) -> float:
        """The scheduler's own flow_shift."""
        return float(self.scheduler.config.get("flow_shift") or 1.0)

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """latent * scaling_factor: SanaPipeline decodes latents / scaling_factor."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        return self.vae.encode(pixels).latent * self.vae.config.scaling_factor

    def size_arguments(self, size) -> dict:
        """The size is a bucket already; binning would move it to the pipeline's own table."""
        return {"use_resolution_binning": False}

    @property
    def instruction(self) -> list[str]:
        """The complex human instruction SanaPipeline prepends to every prompt by default."""
        call = inspect.signature(self.pipeline_class.__call__)
        return call.parameters["complex_human_instruction"].default

    def _text_pipeline(self) -> SanaPipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 300, width], "prompt_attention_mask": [B, 300]}: the
        pipeline's encode_prompt with its default instruction, without the negative pass."""
        embeds, mask, _, _ = self._text_pipeline().encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length,
            complex_human_instruction=self.instruction)
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """Always 300 tokens: the pipeline keeps the first and the last 299 of its padded
        instruction and caption."""
        width = self.text_encoders[0].config.hidden_size
        tokens = self.max_sequence_length
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_attention_mask": torch.ones(count, tokens, dtype=torch.long,
                                                    device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        # SanaPipeline's timestep: the scheduler's (1000 * sigma) times timestep_scale.
        scale = self.transformer.config.timestep_scale
        return network(hidden_states=noisy, encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
                       encoder_attention_mask=embeds["prompt_attention_mask"],
                       timestep=(sigmas * FLOW_TIMESTEPS * scale).to(dtype),
                       return_dict=False)[0]
