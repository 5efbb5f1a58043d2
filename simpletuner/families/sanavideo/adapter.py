"""SANA-Video: Sana's adapter (sana/adapter.py: Gemma2 read through the pipeline's own
encode_prompt with its default complex human instruction, 300 tokens with their mask; the
flow-sigma DPM-Solver++ scheduler's shift; no resolution binning) on video: Wan 2.1's causal 3D
VAE (latents normalised with its latents_mean/latents_std, as SanaVideoPipeline decodes them:
latents * std + mean) and Sana's linear-attention transformer over [B, C, F, h, w] latents,
which predicts the velocity noise - latents at timestep 1000 * sigma (no timestep scale here).
Trained on clips and on images as one-frame clips."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, SanaVideoPipeline, SanaVideoTransformer3DModel

from simpletuner.families.sana.adapter import SanaAdapter
from simpletuner.families.sanavideo.flavours import flavour_mismatch
from simpletuner.families.wan.adapter import as_clips
from simpletuner.models.flow_family import FLOW_TIMESTEPS
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.model_path import family_folder_problem
from simpletuner.models.training_batch import TrainingBatch


class SanaVideoAdapter(SanaAdapter):
    family = "sanavideo"
    transformer_class = SanaVideoTransformer3DModel
    pipeline_class = SanaVideoPipeline
    vae_class = AutoencoderKLWan
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

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] images or [B, 3, F, H, W] clips -> (mode - mean) / std."""
        clips = as_clips(pixels.to(self.device, dtype=self.vae.dtype))
        latents = self.vae.encode(clips).latent_dist.mode()
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean).view(shape).to(latents)
        std = torch.tensor(config.latents_std).view(shape).to(latents)
        return (latents - mean) / std

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
