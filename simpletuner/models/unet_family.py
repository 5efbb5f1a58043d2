"""What SD 1.x, SD 2.x and SDXL share: a UNet denoiser trained with the DDPM objective on VAE
latents, CLIP text encoders, a diffusers Stable Diffusion pipeline. Each family file only says
which text encoders it has, how it encodes prompts and what extra conditioning the UNet gets."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import diffusers
import torch
from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
from transformers import CLIPTokenizer

from simpletuner.models.base import LossSettings, ModelAdapter, ModelFolderError, TrainingBatch
from simpletuner.models.layout import check_model_folder
from simpletuner.models.noise_objective import (
    draw_noise, draw_timesteps, min_snr_weights, weighted_mse)

SUPPORTED_PREDICTION_TYPES = ("epsilon", "v_prediction")


def _load_component(load, folder: Path, subfolder: str):
    try:
        return load(folder, subfolder=subfolder)
    except (OSError, ValueError, KeyError) as error:
        raise ModelFolderError(f"cannot load {subfolder}/ from {folder}: {error}") from error


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
    return _load_component(scheduler_class.from_pretrained, folder, "scheduler")


class UNetFamilyAdapter(ModelAdapter):
    # (text encoder subfolder, its tokenizer subfolder, transformers class), in pipeline order.
    text_encoder_specs: tuple[tuple[str, str, type], ...]
    pipeline_class: type
    forbidden_subfolders: tuple[str, ...] = ("transformer",)  # an SD3 or Flux folder
    trainable_component = "unet"
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")  # every attention projection
    # SDXL's VAE overflows in float16; it stays float32 then (bfloat16 is fine).
    vae_float32_under_fp16 = False

    def __init__(self, *, folder: Path, unet, vae, text_encoders: list, tokenizers: list,
                 noise_scheduler, inference_scheduler, device: torch.device,
                 loss_settings: LossSettings):
        self.folder = folder
        self.unet = unet
        self.vae = vae
        self.text_encoders = text_encoders
        self.tokenizers = tokenizers
        self.noise_scheduler = noise_scheduler
        self.inference_scheduler = inference_scheduler
        self.device = device
        self.loss_settings = loss_settings
        self.prediction_type = noise_scheduler.config.prediction_type

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        text = tuple(name for spec in cls.text_encoder_specs for name in spec[:2])
        return ("unet", "vae", "scheduler") + text

    @classmethod
    def load(cls, folder: Path, *, device: torch.device, weight_dtype: torch.dtype,
             loss_settings: LossSettings) -> "UNetFamilyAdapter":
        folder = Path(folder)
        check_model_folder(folder, cls.family, cls.required_subfolders(),
                           cls.forbidden_subfolders)
        noise_scheduler = _load_component(DDPMScheduler.from_pretrained, folder, "scheduler")
        prediction_type = noise_scheduler.config.prediction_type
        if prediction_type not in SUPPORTED_PREDICTION_TYPES:
            raise ModelFolderError(
                f"{folder}/scheduler has prediction_type {prediction_type!r}; {cls.family} "
                f"training supports {', '.join(SUPPORTED_PREDICTION_TYPES)}")
        unet = _load_component(UNet2DConditionModel.from_pretrained, folder, "unet")
        vae_dtype = weight_dtype
        if cls.vae_float32_under_fp16 and weight_dtype == torch.float16:
            vae_dtype = torch.float32
        # Cast while loading: diffusers keeps any modules it must keep in float32.
        vae = _load_component(partial(AutoencoderKL.from_pretrained, torch_dtype=vae_dtype),
                              folder, "vae")
        text_encoders, tokenizers = [], []
        for encoder_folder, tokenizer_folder, encoder_class in cls.text_encoder_specs:
            text_encoders.append(_load_component(encoder_class.from_pretrained, folder,
                                                 encoder_folder))
            tokenizers.append(_load_component(CLIPTokenizer.from_pretrained, folder,
                                              tokenizer_folder))
        vae.to(device).requires_grad_(False).eval()
        for encoder in text_encoders:
            encoder.to(device, dtype=weight_dtype).requires_grad_(False).eval()
        unet.to(device).requires_grad_(True).train()
        return cls(folder=folder, unet=unet, vae=vae, text_encoders=text_encoders,
                   tokenizers=tokenizers, noise_scheduler=noise_scheduler,
                   inference_scheduler=_load_inference_scheduler(folder), device=device,
                   loss_settings=loss_settings)

    @property
    def trainable(self) -> torch.nn.Module:
        return self.unet

    @property
    def resolution_alignment(self) -> int:
        vae_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        unet_factor = 2 ** (len(self.unet.config.block_out_channels) - 1)
        return vae_factor * unet_factor

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Latents in the VAE's dtype; the distribution's mode, so caching is deterministic."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        latents = self.vae.encode(pixels).latent_dist.mode()
        return latents * self.vae.config.scaling_factor

    def _token_ids(self, tokenizer, prompts: list[str]) -> torch.Tensor:
        tokens = tokenizer(prompts, padding="max_length", max_length=tokenizer.model_max_length,
                           truncation=True, return_tensors="pt")
        return tokens.input_ids.to(self.device)

    def _unet_conditioning(self, batch: TrainingBatch, dtype: torch.dtype) -> dict:
        """Keyword arguments of the UNet call besides the noisy latents and timesteps."""
        return {"encoder_hidden_states":
                batch.prompt_embeds["prompt_embeds"].to(self.device, dtype=dtype)}

    def compute_loss(self, batch: TrainingBatch, generator: torch.Generator | None = None, *,
                     network: torch.nn.Module | None = None) -> torch.Tensor:
        dtype = self.unet.dtype
        latents = batch.latents.to(self.device, dtype=torch.float32)
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
        network = network if network is not None else self.unet
        prediction = network(noisy.to(dtype), timesteps, return_dict=False,
                             **self._unet_conditioning(batch, dtype))[0]
        weights = None
        if self.loss_settings.snr_gamma:
            weights = min_snr_weights(self.noise_scheduler.alphas_cumprod, timesteps,
                                      self.loss_settings.snr_gamma, self.prediction_type)
        return weighted_mse(prediction, target, weights)

    def _pipeline_options(self) -> dict:
        """Pipeline constructor arguments besides the model components."""
        return {}

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        components = {"unet": trainable if trainable is not None else self.unet,
                      "vae": self.vae,
                      # A copy: validation's set_timesteps must not touch the loaded one.
                      "scheduler": type(self.inference_scheduler).from_config(
                          self.inference_scheduler.config)}
        for (encoder_folder, tokenizer_folder, _), encoder, tokenizer in zip(
                self.text_encoder_specs, self.text_encoders, self.tokenizers):
            components[encoder_folder] = encoder
            components[tokenizer_folder] = tokenizer
        return self.pipeline_class(**components, **self._pipeline_options())
