"""SANA-Video: a Gemma2 text encoder read through SanaVideoPipeline's own encode_prompt (its
complex human instruction before the caption, the first token and the last 299 kept, with
their mask), Wan 2.1's causal 3D VAE (latents normalised with its latents_mean/latents_std, as
the pipeline decodes them: latents * std + mean), and Sana's linear-attention transformer over
[B, C, F, h, w] latents, which predicts the velocity noise - latents at timestep 1000 * sigma,
as the pipeline steps its flow-sigma DPM-Solver++ scheduler. Trained on clips and on images as
one-frame clips."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from diffusers import (AutoencoderKLWan, DPMSolverMultistepScheduler, SanaVideoPipeline,
                       SanaVideoTransformer3DModel)
from transformers import AutoTokenizer, Gemma2Model

from simpletuner.families.sanavideo.flavours import flavour_mismatch
from simpletuner.models.flow_family import FLOW_TIMESTEPS, FlowFamilyAdapter
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.model_path import family_folder_problem
from simpletuner.models.training_batch import TrainingBatch


def as_clips(pixels: torch.Tensor) -> torch.Tensor:
    """Images [B, 3, H, W] as one-frame clips [B, 3, 1, H, W]; clips pass unchanged."""
    return pixels.unsqueeze(2) if pixels.ndim == 4 else pixels


class SanaVideoAdapter(FlowFamilyAdapter):
    family = "sanavideo"
    text_encoder_specs = (("text_encoder", "tokenizer", Gemma2Model, AutoTokenizer),)
    transformer_class = SanaVideoTransformer3DModel
    pipeline_class = SanaVideoPipeline
    vae_class = AutoencoderKLWan
    scheduler_class = DPMSolverMultistepScheduler  # flow sigmas, as the folders ship it
    forbidden_subfolders = ("unet", "text_encoder_2")
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")  # SimpleTuner's default
    max_sequence_length = 300  # SanaVideoPipeline's default
    default_validation_frames = 81  # SanaVideoPipeline.__call__'s frames
    default_validation_framerate = 16  # SANA-Video's clips

    def validation_arguments(self, arguments: dict) -> dict:
        """PIL frames; the pipeline calls the frame count ``frames`` (one unless validation's
        clips set num_frames)."""
        arguments = {"num_frames": 1, **arguments, "output_type": "pil"}
        arguments["frames"] = arguments.pop("num_frames")
        return arguments

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        return flavour_mismatch(flavour)

    @classmethod
    def check_folder(cls, folder: Path) -> None:
        problem = family_folder_problem(cls.family, str(folder))  # the 720p's DC-AE-V
        if problem:
            raise ModelFolderError(problem)
        super().check_folder(folder)

    def size_arguments(self, size) -> dict:
        """The size is a bucket already; binning would move it to the pipeline's own table."""
        return {"use_resolution_binning": False}

    @property
    def vae_factor(self) -> int:
        return self.vae.config.scale_factor_spatial

    @property
    def latent_patch(self) -> int:
        return self.transformer.config.patch_size[-1]

    @property
    def resolution_alignment(self) -> int:
        """32: SanaVideoPipeline refuses other sides (its VAE and patches would take 16)."""
        return max(32, self.vae_factor * self.latent_patch)

    def sigma_shift(self, latent_height: int, latent_width: int) -> float:
        """flow_shift when set; else the scheduler's own flow_shift."""
        if self.loss_settings.flow_shift is not None:
            return self.loss_settings.flow_shift
        return float(self.scheduler.config.get("flow_shift") or 1.0)

    def _latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean).view(shape)
        std = torch.tensor(config.latents_std).view(shape)
        return mean.to(like.device, like.dtype), std.to(like.device, like.dtype)

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] images or [B, 3, F, H, W] clips -> (mode - mean) / std."""
        clips = as_clips(pixels.to(self.device, dtype=self.vae.dtype))
        latents = self.vae.encode(clips).latent_dist.mode()
        mean, std = self._latent_statistics(latents)
        return (latents - mean) / std

    @property
    def instruction(self) -> list[str]:
        """The complex human instruction SanaVideoPipeline prepends to every prompt."""
        call = inspect.signature(self.pipeline_class.__call__)
        return call.parameters["complex_human_instruction"].default

    def _text_pipeline(self) -> SanaVideoPipeline:
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
        """Always 300 tokens (the first and the last 299 of instruction and caption)."""
        width, tokens = self.text_encoders[0].config.hidden_size, self.max_sequence_length
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_attention_mask": torch.ones(count, tokens, dtype=torch.long,
                                                    device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        if noisy.ndim != 5:
            raise ValueError("SANA-Video latents are [B, C, F, h, w]; got shape "
                             f"{tuple(noisy.shape)} (rebuild the latent cache with model_family "
                             "sanavideo)")
        embeds = batch.prompt_embeds
        return network(hidden_states=noisy, encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
                       encoder_attention_mask=embeds["prompt_attention_mask"],
                       timestep=(sigmas * FLOW_TIMESTEPS).to(dtype), return_dict=False)[0]
