"""LTX-Video 0.9.x through LTXPipeline: clips (and images as one-frame clips) encoded by its
causal video VAE and normalised as the pipeline denormalises them ((mode - mean) * scaling /
std, [B, C, F, h, w] in the cache), packed into tokens for the transformer as the pipeline
packs them, with the timestep sigma * 1000, the latent grid's size and RoPE scaled to the frame
rate; T5 prompts through the pipeline's own encode_prompt (128 tokens, with their mask)."""

from __future__ import annotations

import torch
from diffusers import (AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXPipeline,
                       LTXVideoTransformer3DModel)
from transformers import AutoTokenizer, T5EncoderModel

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.flow_objective import resolution_shift, sample_sigmas
from simpletuner.models.training_batch import TrainingBatch


def as_clips(pixels: torch.Tensor) -> torch.Tensor:
    """Images [B, 3, H, W] as one-frame clips [B, 3, 1, H, W]; clips pass unchanged."""
    return pixels.unsqueeze(2) if pixels.ndim == 4 else pixels


class LTXVideoAdapter(FlowFamilyAdapter):
    family = "ltxvideo"
    text_encoder_specs = (("text_encoder", "tokenizer", T5EncoderModel, AutoTokenizer),)
    transformer_class = LTXVideoTransformer3DModel
    pipeline_class = LTXPipeline
    vae_class = AutoencoderKLLTXVideo
    scheduler_class = FlowMatchEulerDiscreteScheduler
    forbidden_subfolders = ("unet", "text_encoder_2", "audio_vae")  # LTX-2 has an audio VAE
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")  # SimpleTuner's LTX default
    max_sequence_length = 128  # LTXPipeline.__call__'s
    # LTXPipeline.__call__'s frame_rate: the RoPE's time scale in training as in validation.
    frame_rate = 25
    default_validation_frames = 161  # LTXPipeline.__call__'s num_frames
    default_validation_framerate = 25

    def validation_arguments(self, arguments: dict) -> dict:
        """PIL frames; one frame unless ``arguments`` set num_frames (validation's clips do)."""
        return {"num_frames": 1, **arguments, "output_type": "pil"}

    @property
    def vae_factor(self) -> int:
        return self.vae.spatial_compression_ratio

    @property
    def latent_patch(self) -> int:
        return self.transformer.config.patch_size

    def _statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        shape = (1, -1, 1, 1, 1)
        mean = self.vae.latents_mean.view(shape).to(like.device, like.dtype)
        std = self.vae.latents_std.view(shape).to(like.device, like.dtype)
        return mean, std, self.vae.config.scaling_factor

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] images or [B, 3, F, H, W] clips -> [B, C, F', h, w], the inverse of
        LTXPipeline._denormalize_latents before decoding."""
        clips = as_clips(pixels.to(self.device, dtype=self.vae.dtype))
        latents = self.vae.encode(clips).latent_dist.mode()
        mean, std, scaling = self._statistics(latents)
        return (latents - mean) * scaling / std

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 128, width], "prompt_attention_mask": [B, 128]}:
        LTXPipeline's own encode_prompt without the negative pass."""
        pipeline = self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                       **self._pipeline_text_components())
        embeds, mask, _, _ = pipeline.encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length)
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}

    def draw_sigmas(self, latents: torch.Tensor, generator: torch.Generator | None
                    ) -> torch.Tensor:
        """Shifted as LTXPipeline shifts its schedule: by the clip's token count (frames times
        height times width), unless flow_shift is set."""
        settings = self.loss_settings
        shift = settings.flow_shift
        if shift is None:
            shift = resolution_shift(latents[0, 0].numel(), self.scheduler.config)
        return sample_sigmas(latents.shape[0], sampling=settings.flow_timestep_sampling,
                             logit_mean=settings.flow_logit_mean,
                             logit_std=settings.flow_logit_std, shift=shift,
                             device=self.device, generator=generator)

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        if noisy.ndim != 5:
            raise ValueError(f"LTX-Video latents are [B, C, F, h, w]; got shape "
                             f"{tuple(noisy.shape)} (rebuild the latent cache with model_family "
                             "ltxvideo)")
        frames, height, width = noisy.shape[2:]
        patch, patch_t = self.latent_patch, self.transformer.config.patch_size_t
        spatial = self.vae.spatial_compression_ratio
        output = network(
            hidden_states=LTXPipeline._pack_latents(noisy, patch, patch_t),
            encoder_hidden_states=batch.prompt_embeds["prompt_embeds"].to(dtype),
            encoder_attention_mask=batch.prompt_embeds["prompt_attention_mask"],
            timestep=(sigmas * self.scheduler.config.num_train_timesteps).to(dtype),
            num_frames=frames // patch_t, height=height // patch, width=width // patch,
            rope_interpolation_scale=(self.vae.temporal_compression_ratio / self.frame_rate,
                                      spatial, spatial),
            return_dict=False)[0]
        return LTXPipeline._unpack_latents(output, frames // patch_t, height // patch,
                                           width // patch, patch, patch_t)
