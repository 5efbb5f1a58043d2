"""Wan 2.2 T2V-A14B: two experts of Wan 2.1's architecture, transformer/ denoising while the
timestep is at or above boundary_ratio * 1000 (high noise) and transformer_2/ below it, as
WanPipeline switches between them. A run trains one expert (model_flavour t2v-14b-2.2-high or
-low) on its own noise range only; the other stays frozen as loaded, in the weight dtype, and
validation and the exported pipeline use both, each in its own slot. Wan 2.2 TI2V-5B: one
transformer on the Wan 2.2 VAE, trained as text-to-video, and as image-to-video on a
``video.is_i2v`` dataset."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from simpletuner.models.base import LossSettings

from simpletuner.models.layout import ModelFolderError

from simpletuner.families.wan.adapter import WanAdapter, as_clips
from simpletuner.families.wan.flavours import EXPERT_FLAVOURS, boundary_ratio
from simpletuner.models.components import checked_folder, load_component, load_frozen_components
from simpletuner.models.sigma_range import sample_sigmas_in_range
from simpletuner.models.training_batch import TrainingBatch

EXPERT_SUBFOLDERS = {"high": ("transformer", "transformer_2"),  # (trained, frozen)
                     "low": ("transformer_2", "transformer")}


class WanExpertAdapter(WanAdapter):
    other_network_folder = "transformer_2"  # plan --memory: the experts share one architecture

    def __init__(self, *, expert: str, frozen_expert, boundary: float, **shared):
        super().__init__(**shared)
        self.expert = expert
        self.frozen_expert = frozen_expert
        self.boundary = boundary

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + ("transformer_2",)

    @classmethod
    def load(cls, folder: Path, *, device: torch.device, weight_dtype: torch.dtype,
             loss_settings: LossSettings) -> "WanExpertAdapter":
        folder = checked_folder(cls, folder)
        expert = EXPERT_FLAVOURS.get(loss_settings.model_flavour)
        if expert is None:  # preflight says so first; a direct load must not guess
            raise ModelFolderError(f"{folder} is a two-expert Wan 2.2 model: model_flavour must "
                                   f"be {' or '.join(EXPERT_FLAVOURS)}")
        trained_folder, frozen_folder = EXPERT_SUBFOLDERS[expert]
        load = cls.transformer_class.from_pretrained
        transformer = load_component(load, folder, trained_folder)
        # Cast while loading: diffusers keeps the modules it must keep in float32.
        frozen_expert = load_component(partial(load, torch_dtype=weight_dtype), folder,
                                       frozen_folder)
        frozen_expert.to(device).requires_grad_(False).eval()
        scheduler = load_component(cls.scheduler_class.from_pretrained, folder, "scheduler")
        frozen = load_frozen_components(cls, folder, device=device, weight_dtype=weight_dtype,
                                        vae_dtype=weight_dtype)
        transformer.to(device).requires_grad_(True).train()
        return cls(folder=folder, transformer=transformer, scheduler=scheduler, device=device,
                   loss_settings=loss_settings, expert=expert, frozen_expert=frozen_expert,
                   boundary=boundary_ratio(folder), **frozen)

    def move_to(self, device: torch.device,
                except_modules: list[torch.nn.Module] | tuple = ()) -> None:
        super().move_to(device, except_modules)
        self.frozen_expert.to(device)

    @property
    def sigma_range(self) -> tuple[float, float]:
        """The trained expert's noise levels: WanPipeline gives transformer/ the timesteps
        t >= boundary * 1000 (t = sigma * 1000) and transformer_2/ those below."""
        return (self.boundary, 1.0) if self.expert == "high" else (0.0, self.boundary)

    def draw_sigmas(self, latents: torch.Tensor, generator: torch.Generator | None
                    ) -> torch.Tensor:
        settings = self.loss_settings
        low, high = self.sigma_range
        return sample_sigmas_in_range(
            latents.shape[0], low=low, high=high, sampling=settings.flow_timestep_sampling,
            logit_mean=settings.flow_logit_mean, logit_std=settings.flow_logit_std,
            shift=self.shift_for(latents), device=self.device,
            generator=generator)

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        """Both experts in their slots: the trained one (or ``trainable``) and the frozen one."""
        trained = trainable if trainable is not None else self.transformer
        high, low = ((trained, self.frozen_expert) if self.expert == "high"
                     else (self.frozen_expert, trained))
        return self.pipeline_class(**self._pipeline_components(high), transformer_2=low,
                                   boundary_ratio=self.boundary)


class WanTI2VAdapter(WanAdapter):
    """Wan 2.2 TI2V-5B: one transformer on the Wan 2.2 VAE's 48-channel latents (16x spatial
    with the VAE's own 2x2 patchify; its latents_mean/std), and expand_timesteps: one timestep
    per latent token, all equal for text-to-video. A ``video.is_i2v`` dataset trains it as
    WanImageToVideoPipeline runs it with expand_timesteps (no CLIP image encoder): the latents
    of the first frame alone, cached as ``first_frame_latents``, replace latent frame 0 of the
    noisy input clean, its tokens get timestep 0, and the loss leaves out that frame, which the
    pipeline overwrites with the condition."""

    trains_image_to_video = True

    def network_timesteps(self, noisy: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
        """[B, tokens]: sigma * 1000 repeated over the frames x patch rows x patch columns."""
        tokens = noisy.shape[2] * self._tokens_per_frame(noisy)
        return super().network_timesteps(noisy, sigmas).view(-1, 1).expand(-1, tokens)

    def _tokens_per_frame(self, latents: torch.Tensor) -> int:
        _, patch_height, patch_width = self.transformer.config.patch_size
        return (latents.shape[3] // patch_height) * (latents.shape[4] // patch_width)

    @torch.no_grad()
    def encode_for_cache(self, pixels: torch.Tensor, first_frame_condition: bool = False):
        """The latents; for an is_i2v dataset also those of the first frame encoded alone, as
        the pipeline's prepare_latents encodes its image."""
        latents = self.encode_images(pixels)
        if not first_frame_condition:
            return latents
        return {"latent": latents, "first_frame_latents": self.encode_images(
            as_clips(pixels)[:, :, :1])}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        condition = batch.conditioning.get("first_frame_latents")
        if condition is None:
            return super()._predict(network, noisy, sigmas, batch, dtype)
        given = torch.cat([condition.to(noisy.dtype), noisy[:, :, 1:]], dim=2)
        timesteps = self.network_timesteps(noisy, sigmas).clone()
        timesteps[:, :self._tokens_per_frame(noisy)] = 0  # the first frame's tokens: clean
        return network(hidden_states=given, timestep=timesteps.to(dtype),
                       encoder_hidden_states=batch.prompt_embeds["prompt_embeds"].to(dtype),
                       return_dict=False)[0]

    def trained_part(self, prediction: torch.Tensor, target: torch.Tensor,
                     batch: TrainingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        if "first_frame_latents" not in batch.conditioning:
            return prediction, target
        if prediction.shape[2] < 2:
            raise ValueError("a video.is_i2v dataset conditions on its first frame, so a "
                             "one-frame clip or image leaves nothing to train; give it clips "
                             "of 5 frames or more")
        return prediction[:, :, 1:], target[:, :, 1:]

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        pipeline = super().build_pipeline(trainable)
        pipeline.register_to_config(expand_timesteps=True)  # saved in model_index.json too
        return pipeline
