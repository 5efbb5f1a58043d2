"""What SD3 and Flux share: a transformer trained with the rectified-flow objective on shifted
and scaled VAE latents, CLIP and T5 text encoders, FlowMatchEulerDiscreteScheduler and a
diffusers pipeline. Each family file says how prompts are encoded and how its transformer is
called; the objective (flow_objective.py) and everything else is here."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from simpletuner.models.base import LossSettings, ModelAdapter

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.components import checked_folder, load_component, load_frozen_components
from simpletuner.models.flow_objective import (
    auto_shift, flow_noisy_and_target, resolution_shift, sample_sigmas)
from simpletuner.models.prior_preservation import BaseModel, base_model_target
from simpletuner.models.loss_types import flow_noise_ratio, huber_thresholds, objective_loss
from simpletuner.models.noise_objective import draw_noise
from simpletuner.models.transfer import batch_to_device

FLOW_TIMESTEPS = 1000  # SimpleTuner's flow timestep is 1000 * sigma (its Huber schedules use it)


class FlowFamilyAdapter(ModelAdapter):
    transformer_class: type
    forbidden_subfolders: tuple[str, ...] = ("unet",)  # a UNet (SD 1.x/2.x/XL) folder
    trainable_component = "transformer"
    scheduler_class: type = FlowMatchEulerDiscreteScheduler  # the scheduler/ subfolder's class
    # Image and text stream projections of the joint attention (single blocks: image only).
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0",
                           "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    t5_max_length: int  # tokens of T5 context, as the family's pipeline uses by default

    def __init__(self, *, transformer, scheduler, **shared):
        super().__init__(**shared)  # folder, vae, text encoders, tokenizers, device...
        self.transformer = transformer
        self.scheduler = scheduler

    @classmethod
    def load(cls, folder: Path, *, device: torch.device, weight_dtype: torch.dtype,
             loss_settings: LossSettings) -> "FlowFamilyAdapter":
        folder = checked_folder(cls, folder)
        scheduler = load_component(cls.scheduler_class.from_pretrained, folder,
                                   "scheduler")
        transformer = load_component(cls.transformer_class.from_pretrained, folder,
                                     "transformer")
        frozen = load_frozen_components(cls, folder, device=device,
                                        weight_dtype=weight_dtype, vae_dtype=weight_dtype)
        transformer.to(device).requires_grad_(True).train()
        return cls(folder=folder, transformer=transformer, scheduler=scheduler, device=device,
                   loss_settings=loss_settings, **frozen,
                   **cls.load_conditioning_components(folder, device=device,
                                                      weight_dtype=weight_dtype))

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        """Frozen parts beyond the VAE and text encoders, as keyword arguments of the
        constructor (Wan I2V's image encoder and processor); none by default."""
        return {}

    @property
    def trainable(self) -> torch.nn.Module:
        return self.transformer

    @classmethod
    def swappable_blocks(cls, network: torch.nn.Module) -> list[torch.nn.Module]:
        """The items of the transformer's top-level ModuleLists (Flux: double then single
        blocks), in the order the forward runs them."""
        return [block for child in network.children()
                if isinstance(child, torch.nn.ModuleList) for block in child]

    @property
    def latent_patch(self) -> int:
        """Latent pixels per transformer token along each side."""
        return self.transformer.config.patch_size

    @property
    def resolution_alignment(self) -> int:
        return self.vae_factor * self.latent_patch

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """(mode - shift_factor) * scaling_factor, as the pipelines decode it back."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        latents = self.vae.encode(pixels).latent_dist.mode()
        shift = self.vae.config.shift_factor or 0.0
        return (latents - shift) * self.vae.config.scaling_factor

    def _t5_ids(self, tokenizer, prompts: list[str]) -> torch.Tensor:
        return self._token_ids(tokenizer, prompts,
                               min(self.t5_max_length, tokenizer.model_max_length))

    def shift_for(self, latents: torch.Tensor) -> float:
        """The shift of ``latents``' noise levels, in SimpleTuner's order:
        flow_schedule_auto_shift (from the latents' token count), else flow_shift (0: none),
        else the model's own (``sigma_shift``)."""
        settings = self.loss_settings
        if settings.flow_schedule_auto_shift:
            return auto_shift(tuple(latents.shape), self.scheduler.config)
        if settings.flow_shift is not None:
            return settings.flow_shift or 1.0
        return self.sigma_shift(*latents.shape[-2:])

    def sigma_shift(self, latent_height: int, latent_width: int) -> float:
        """The model scheduler's shift: resolution-dependent when it shifts dynamically (Flux),
        its fixed ``shift`` otherwise (SD3)."""
        config = self.scheduler.config
        if config.get("use_dynamic_shifting", False):
            tokens = (latent_height // self.latent_patch) * (latent_width // self.latent_patch)
            return resolution_shift(tokens, config)
        return float(config.get("shift", 1.0))

    @abstractmethod
    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        """The network's velocity prediction, shaped like ``noisy``; ``batch`` is on the device
        already (compute_loss moved it)."""

    def draw_sigmas(self, latents: torch.Tensor, generator: torch.Generator | None
                    ) -> torch.Tensor:
        """One noise level per sample; a family that trains part of the range narrows it."""
        settings = self.loss_settings
        return sample_sigmas(latents.shape[0], sampling=settings.flow_timestep_sampling,
                             logit_mean=settings.flow_logit_mean,
                             logit_std=settings.flow_logit_std,
                             shift=self.shift_for(latents),
                             device=self.device, generator=generator)

    def compute_loss(self, batch: TrainingBatch, generator: torch.Generator | None = None, *,
                     network: torch.nn.Module | None = None,
                     base_model: BaseModel | None = None) -> torch.Tensor:
        settings = self.loss_settings
        batch = batch_to_device(batch, self.device)  # also a host batch (evaluation): no wait
        latents = batch.latents.to(torch.float32)
        noise = draw_noise(latents.shape, device=self.device, generator=generator,
                           noise_offset=settings.noise_offset)
        sigmas = self.draw_sigmas(latents, generator)
        if self.token_router is not None:  # TREAD's selection, after what the loss draws
            self.token_router.reseed(generator)
        noisy, target = flow_noisy_and_target(latents, noise, sigmas)
        network = network if network is not None else self.transformer

        def predict() -> torch.Tensor:
            return self._predict(network, noisy.to(self.transformer.dtype), sigmas, batch,
                                 self.transformer.dtype)

        if base_model is not None:  # is_regularisation_data: the base model's prediction
            target = base_model_target(base_model, predict)
        prediction = predict()
        thresholds = None
        if settings.loss_type != "l2":  # SimpleTuner's flow timestep: 1000 * sigma
            thresholds = huber_thresholds(settings.huber_schedule, settings.huber_c,
                                          timesteps=sigmas * FLOW_TIMESTEPS,
                                          num_train_timesteps=FLOW_TIMESTEPS,
                                          noise_ratio=flow_noise_ratio(sigmas))
        prediction, target = self.trained_part(prediction, target, batch)
        return objective_loss(prediction, target, loss_type=settings.loss_type,
                              thresholds=thresholds, mask=batch.loss_mask)

    def trained_part(self, prediction: torch.Tensor, target: torch.Tensor,
                     batch: TrainingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """What of the prediction the loss covers: all of it, unless the family's pipeline
        never uses a part (Wan 2.2 TI2V-5B's given first frame)."""
        return prediction, target

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        return self.pipeline_class(**self._pipeline_components(trainable))

    def _pipeline_networks(self, trainable: torch.nn.Module | None) -> dict:
        """The pipeline's networks: the transformer, ``trainable`` in its place when given."""
        return {"transformer": trainable if trainable is not None else self.transformer}

    def _pipeline_components(self, trainable: torch.nn.Module | None) -> dict:
        return {**self._pipeline_networks(trainable),
                "vae": self.vae,
                # A copy: validation's set_timesteps must not touch the loaded one.
                "scheduler": type(self.scheduler).from_config(self.scheduler.config),
                **self._pipeline_text_components()}
