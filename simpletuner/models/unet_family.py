"""What SD 1.x, SD 2.x and SDXL share: a UNet denoiser trained with the DDPM objective on VAE
latents, CLIP text encoders, a diffusers Stable Diffusion pipeline. Each family file only says
which text encoders it has, how it encodes prompts and what extra conditioning the UNet gets.
A noise-predicting transformer (PixArt Sigma) shares the objective, calling its own network in
``_predict``."""

from __future__ import annotations

import json
from pathlib import Path

import diffusers
import torch
from diffusers import DDPMScheduler, UNet2DConditionModel

from simpletuner.models.base import LossSettings, ModelAdapter

from simpletuner.models.layout import ModelFolderError

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.components import checked_folder, load_component, load_frozen_components
from simpletuner.models.prior_preservation import BaseModel, base_model_target
from simpletuner.models.loss_types import ddpm_noise_ratio, huber_thresholds, objective_loss
from simpletuner.models.noise_objective import draw_noise, draw_timesteps, min_snr_weights
from simpletuner.models.transfer import batch_to_device

SUPPORTED_PREDICTION_TYPES = ("epsilon", "v_prediction")


def _load_inference_scheduler(folder: Path):
    """The scheduler class the folder names (PNDM, DDIM, Euler...), used for validation."""
    config_path = folder / "scheduler" / "scheduler_config.json"
    try:
        class_name = json.loads(config_path.read_text(encoding="utf-8"))["_class_name"]
    except (OSError, ValueError, KeyError) as error:
        raise ModelFolderError(
            f"cannot read the scheduler class from {config_path}: {error}") from error
    scheduler_class = getattr(diffusers, class_name, None)
    if scheduler_class is None:
        raise ModelFolderError(f"{config_path} names scheduler {class_name!r}, which this "
                               f"diffusers {diffusers.__version__} does not have")
    return load_component(scheduler_class.from_pretrained, folder, "scheduler")


class UNetFamilyAdapter(ModelAdapter):
    forbidden_subfolders: tuple[str, ...] = ("transformer",)  # an SD3 or Flux folder
    trainable_component = "unet"
    network_folder = "unet"  # the denoising network's folder (a ControlNet run trains another)
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")  # every attention projection
    # SDXL's VAE overflows in float16; it stays float32 then (bfloat16 is fine).
    vae_float32_under_fp16 = False

    def __init__(self, *, unet, noise_scheduler, inference_scheduler, **shared):
        super().__init__(**shared)  # folder, vae, text encoders, tokenizers, device...
        self.unet = unet
        self.noise_scheduler = noise_scheduler
        self.inference_scheduler = inference_scheduler
        self.prediction_type = noise_scheduler.config.prediction_type

    @classmethod
    def load(cls, folder: Path, *, device: torch.device, weight_dtype: torch.dtype,
             loss_settings: LossSettings) -> "UNetFamilyAdapter":
        folder = checked_folder(cls, folder)
        noise_scheduler = load_component(DDPMScheduler.from_pretrained, folder, "scheduler")
        prediction_type = noise_scheduler.config.prediction_type
        if prediction_type not in SUPPORTED_PREDICTION_TYPES:
            raise ModelFolderError(
                f"{folder}/scheduler has prediction_type {prediction_type!r}; {cls.family} "
                f"training supports {', '.join(SUPPORTED_PREDICTION_TYPES)}")
        # The trained network: the UNet, or a family's noise-predicting transformer_class.
        network_class = getattr(cls, "transformer_class", UNet2DConditionModel)
        unet = load_component(network_class.from_pretrained, folder, cls.network_folder)
        vae_dtype = weight_dtype
        if cls.vae_float32_under_fp16 and weight_dtype == torch.float16:
            vae_dtype = torch.float32
        frozen = load_frozen_components(cls, folder, device=device,
                                        weight_dtype=weight_dtype, vae_dtype=vae_dtype)
        unet.to(device).requires_grad_(True).train()
        return cls(folder=folder, unet=unet, noise_scheduler=noise_scheduler,
                   inference_scheduler=_load_inference_scheduler(folder), device=device,
                   loss_settings=loss_settings, **frozen)

    @property
    def trainable(self) -> torch.nn.Module:
        return self.unet

    @property
    def resolution_alignment(self) -> int:
        unet_factor = 2 ** (len(self.unet.config.block_out_channels) - 1)
        return self.vae_factor * unet_factor

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Latents in the VAE's dtype; the distribution's mode, so caching is deterministic."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        latents = self.vae.encode(pixels).latent_dist.mode()
        return latents * self.vae.config.scaling_factor

    def _unet_conditioning(self, batch: TrainingBatch, dtype: torch.dtype) -> dict:
        """Keyword arguments of the UNet call besides the noisy latents and timesteps; ``batch``
        is on the device already (compute_loss moved it)."""
        return {"encoder_hidden_states": batch.prompt_embeds["prompt_embeds"].to(dtype)}

    def _predict(self, network, noisy: torch.Tensor, timesteps: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        """The network's prediction for ``noisy`` (the objective's target's shape)."""
        return network(noisy, timesteps, return_dict=False,
                       **self._unet_conditioning(batch, dtype))[0]

    def compute_loss(self, batch: TrainingBatch, generator: torch.Generator | None = None, *,
                     network: torch.nn.Module | None = None,
                     base_model: BaseModel | None = None) -> torch.Tensor:
        dtype = self.trainable.dtype
        batch = batch_to_device(batch, self.device)  # also a host batch (evaluation): no wait
        latents = batch.latents.to(torch.float32)
        noise = draw_noise(latents.shape, device=self.device, generator=generator,
                           noise_offset=self.loss_settings.noise_offset)
        timesteps = draw_timesteps(latents.shape[0],
                                   self.noise_scheduler.config.num_train_timesteps,
                                   device=self.device, generator=generator)
        noisy = self.noise_scheduler.add_noise(latents, noise, timesteps)
        if self.prediction_type == "v_prediction":
            target = self.noise_scheduler.get_velocity(latents, noise, timesteps)
        else:
            target = noise
        network = network if network is not None else self.trainable

        def predict() -> torch.Tensor:
            return self._predict(network, noisy.to(dtype), timesteps, batch, dtype)

        if base_model is not None:  # is_regularisation_data: the base model's prediction
            target = base_model_target(base_model, predict)
        prediction = predict()
        settings = self.loss_settings
        alphas_cumprod = self.noise_scheduler.alphas_cumprod
        weights = None
        if settings.snr_gamma:
            weights = min_snr_weights(alphas_cumprod, timesteps, settings.snr_gamma,
                                      self.prediction_type)
        thresholds = None
        if settings.loss_type != "l2":
            thresholds = huber_thresholds(
                settings.huber_schedule, settings.huber_c, timesteps=timesteps,
                num_train_timesteps=self.noise_scheduler.config.num_train_timesteps,
                noise_ratio=ddpm_noise_ratio(alphas_cumprod, timesteps))
        return objective_loss(prediction, target, loss_type=settings.loss_type,
                              thresholds=thresholds, weights=weights, mask=batch.loss_mask)

    def _predict(self, network, noisy: torch.Tensor, timesteps: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        """The network's prediction (noise, or v), shaped like ``noisy``; a noise-predicting
        transformer (PixArt) calls its own network here."""
        return network(noisy, timesteps, return_dict=False,
                       **self._unet_conditioning(batch, dtype))[0]

    def _pipeline_options(self) -> dict:
        """Pipeline constructor arguments besides the model components."""
        return {}

    def _pipeline_networks(self, trainable: torch.nn.Module | None) -> dict:
        """The pipeline's networks: the UNet, ``trainable`` in its place when given."""
        return {"unet": trainable if trainable is not None else self.unet}

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        components = {**self._pipeline_networks(trainable),
                      "vae": self.vae,
                      # A copy: validation's set_timesteps must not touch the loaded one.
                      "scheduler": type(self.inference_scheduler).from_config(
                          self.inference_scheduler.config),
                      **self._pipeline_text_components()}
        return self.pipeline_class(**components, **self._pipeline_options())
