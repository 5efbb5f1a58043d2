"""ERNIE-Image (baidu/ERNIE-Image): a Mistral3 text encoder read through ErnieImagePipeline's own
encode_prompt (each prompt alone, BOS first, no padding, the second-to-last hidden states), the
FLUX.2 VAE whose latents the pipeline patchifies 2x2 and normalises by its batch-norm
statistics, and a single-stream transformer that takes the batch's captions zero-padded with
their lengths and the timestep as 1000 * sigma, predicting noise - latents as the pipeline's
Euler step reads it. Prompt enhancement (the pipeline's optional "pe" model) is not trained."""

from __future__ import annotations

import torch
from diffusers import AutoencoderKLFlux2, ErnieImagePipeline, ErnieImageTransformer2DModel
from transformers import AutoTokenizer, Mistral3Model

from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


class ErnieImageAdapter(FlowFamilyAdapter):
    family = "ernie"
    text_encoder_specs = (("text_encoder", "tokenizer", Mistral3Model, AutoTokenizer),)
    transformer_class = ErnieImageTransformer2DModel
    pipeline_class = ErnieImagePipeline
    vae_class = AutoencoderKLFlux2
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    # SimpleTuner's default ERNIE targets: every block's attention projections.
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")

    @property
    def vae_factor(self) -> int:
        """The VAE's 8x and the 2x2 patchify, as the pipeline's vae_scale_factor."""
        return 2 ** len(self.vae.config.block_out_channels)

    @property
    def latent_patch(self) -> int:
        return self.transformer.config.patch_size

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """The mode, patchified, normalised by the VAE's batch norm: what the pipeline's
        denoising loop runs on (it undoes both before decoding)."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        latents = ErnieImagePipeline._patchify_latents(self.vae.encode(pixels).latent_dist.mode())
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents)
        # the pipeline's own epsilon (1e-5) when it decodes
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + 1e-5).to(latents)
        return (latents - mean) / std

    def _text_pipeline(self) -> ErnieImagePipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T, width], "prompt_embeds_mask": [B, T]}: the pipeline's
        encode_prompt (one unpadded tensor per prompt), zero-padded to the longest as its
        _pad_text pads a batch; the mask marks each prompt's own tokens."""
        hiddens = self._text_pipeline().encode_prompt(prompts, self.device)
        embeds, lengths = ErnieImagePipeline._pad_text(
            hiddens, self.device, hiddens[0].dtype, hiddens[0].shape[-1])
        mask = torch.arange(embeds.shape[1], device=self.device)[None] < lengths[:, None]
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask.to(torch.long)}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """The caption's tokens as the folder's tokenizer counts them (nothing is padded)."""
        tokens = len(self.tokenizers[0](PLANNED_CAPTION).input_ids)
        width = self.text_encoders[0].config.text_config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_embeds_mask": torch.ones(count, tokens, dtype=torch.long,
                                                 device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        # The transformer masks each caption past its length, as _pad_text's lengths say.
        lengths = embeds["prompt_embeds_mask"].to(torch.long).sum(dim=1)
        # The pipeline's timestep is the scheduler's: 1000 * sigma.
        timestep = (sigmas * self.scheduler.config.num_train_timesteps).to(dtype)
        return network(hidden_states=noisy, timestep=timestep,
                       text_bth=embeds["prompt_embeds"].to(dtype), text_lens=lengths,
                       return_dict=False)[0]
