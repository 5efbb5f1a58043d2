"""PixArt Sigma: T5 read through PixArtSigmaPipeline's own encode_prompt (300 tokens with their
mask), SDXL's VAE, and a DiT trained on the DDPM noise (unet_family.py's objective) at the
scheduler's integer timesteps; of its output (noise, then the variance it also predicts) the
noise half is trained and the pipeline keeps only that half too. diffusers gives the
transformer no peft loader: training/adapters/lora.py injects the LoRA with peft directly."""

from __future__ import annotations

import torch
from diffusers import PixArtSigmaPipeline, PixArtTransformer2DModel
from transformers import T5EncoderModel, T5Tokenizer

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.unet_family import UNetFamilyAdapter


class PixArtSigmaAdapter(UNetFamilyAdapter):
    family = "pixart_sigma"
    text_encoder_specs = (("text_encoder", "tokenizer", T5EncoderModel, T5Tokenizer),)
    transformer_class = PixArtTransformer2DModel  # loaded from trainable_component/
    pipeline_class = PixArtSigmaPipeline
    trainable_component = network_folder = "transformer"
    forbidden_subfolders = ("unet", "text_encoder_2")
    vae_float32_under_fp16 = True  # SDXL's VAE
    max_sequence_length = 300  # PixArtSigmaPipeline's default

    @property
    def resolution_alignment(self) -> int:
        return self.vae_factor * self.trainable.config.patch_size

    def _text_pipeline(self) -> PixArtSigmaPipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(vae=None, transformer=None, scheduler=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 300, width], "prompt_attention_mask": [B, 300]}: the
        pipeline's encode_prompt without the negative pass."""
        embeds, mask, _, _ = self._text_pipeline().encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length)
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def _predict(self, network, noisy: torch.Tensor, timesteps: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        output = network(noisy, encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
                         encoder_attention_mask=embeds["prompt_attention_mask"],
                         timestep=timesteps, return_dict=False,
                         added_cond_kwargs={"resolution": None, "aspect_ratio": None})[0]
        return output[:, :noisy.shape[1]]  # the noise; the learned variance is not trained

    def size_arguments(self, size) -> dict:
        """The size is a bucket already; binning would move it to the pipeline's own table."""
        return {"use_resolution_binning": False}

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        return self.pipeline_class(
            transformer=trainable if trainable is not None else self.unet, vae=self.vae,
            scheduler=type(self.inference_scheduler).from_config(
                self.inference_scheduler.config),
            **self._pipeline_text_components())
