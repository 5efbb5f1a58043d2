"""AuraFlow: a UMT5 encoder read through AuraFlowPipeline's own encode_prompt (256 tokens, the
padding's features zeroed, no mask for the transformer), the SDXL VAE (scaled, not shifted), and
an MMDiT transformer that takes sigma itself as the timestep (the pipeline's t / 1000) and
predicts the velocity noise - latents its FlowMatchEulerDiscreteScheduler steps with."""

from __future__ import annotations

import torch
from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel
from transformers import T5Tokenizer, UMT5EncoderModel

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


class AuraFlowAdapter(FlowFamilyAdapter):
    family = "auraflow"
    text_encoder_specs = (("text_encoder", "tokenizer", UMT5EncoderModel, T5Tokenizer),)
    transformer_class = AuraFlowTransformer2DModel
    pipeline_class = AuraFlowPipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    max_sequence_length = 256  # AuraFlowPipeline's default

    def _text_pipeline(self) -> AuraFlowPipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 256, width]}: the pipeline's encode_prompt without the negative
        pass; its mask is already applied (padding zeroed) and the transformer takes none."""
        embeds, _, _, _ = self._text_pipeline().encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length)
        return {"prompt_embeds": embeds}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        return network(hidden_states=noisy, timestep=sigmas.to(dtype),
                       encoder_hidden_states=batch.prompt_embeds["prompt_embeds"].to(dtype),
                       return_dict=False)[0]
