"""Wan 2.1 text-to-video (Wan-AI/Wan2.1-T2V-1.3B and -14B), trained on clips and on images as
one-frame clips: latents are [B, C, F, h, w] (F = 1 for an image) from the causal 3D VAE,
normalised with its latents_mean/latents_std as WanPipeline decodes them. The transformer
patchifies them itself and takes the timestep as sigma * 1000 (UniPC's flow sigmas, as
WanPipeline passes them) and UMT5's last hidden states, each prompt cut to its own length and
zero-padded to 512. An image-to-video folder (WanImageToVideoPipeline) gets i2v.py's
adapter, a Wan 2.2 A14B or TI2V-5B folder wan22.py's (the spec names them)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from transformers import AutoTokenizer, UMT5EncoderModel

from simpletuner.models.layout import ModelFolderError

from simpletuner.families.wan.flavours import flavour_mismatch
from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.model_path import family_folder_problem
from simpletuner.models.token_routing import TokenLayout
from simpletuner.models.training_batch import TrainingBatch


def as_clips(pixels: torch.Tensor) -> torch.Tensor:
    """Images [B, 3, H, W] as one-frame clips [B, 3, 1, H, W]; clips pass unchanged."""
    return pixels.unsqueeze(2) if pixels.ndim == 4 else pixels


def route_rope(rope: tuple, keep: torch.Tensor, count: int) -> tuple:
    """Wan's rotary embedding, [1, tokens, 1, D] each: the kept rows."""
    return tuple(rows[:, keep] for rows in rope)


def route_temb(temb: torch.Tensor, keep: torch.Tensor, count: int) -> torch.Tensor:
    """Wan 2.2 TI2V-5B's per-token timestep projection ([B, tokens, 6, D]); one for all
    tokens ([B, 6, D]) stays."""
    return temb[:, keep] if temb.ndim == 4 else temb


class WanAdapter(FlowFamilyAdapter):
    family = "wan"
    text_encoder_specs = (("text_encoder", "tokenizer", UMT5EncoderModel, AutoTokenizer),)
    transformer_class = WanTransformer3DModel
    pipeline_class = WanPipeline
    vae_class = AutoencoderKLWan
    scheduler_class = UniPCMultistepScheduler  # Wan's own, with flow sigmas
    # UNet families; SD3, Flux (CLIP + T5); an image encoder beside a WanPipeline index.
    forbidden_subfolders = ("unet", "text_encoder_2", "image_encoder")
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")  # SimpleTuner's Wan default
    # TREAD: the video tokens are the blocks' hidden_states and their output
    token_layout = TokenLayout("hidden_states", {"rotary_emb": route_rope, "temb": route_temb})
    t5_max_length = 512  # WanPipeline.__call__'s max_sequence_length

    default_validation_frames = 81  # WanPipeline.__call__'s num_frames
    default_validation_framerate = 16  # Wan 2.1's training and export rate

    def validation_arguments(self, arguments: dict) -> dict:
        """PIL frames (WanPipeline returns frames); one frame unless ``arguments`` set
        num_frames (validation's clips do)."""
        return {"num_frames": 1, **arguments, "output_type": "pil"}

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        return flavour_mismatch(Path(folder), flavour)

    @classmethod
    def check_folder(cls, folder: Path) -> None:
        problem = family_folder_problem(cls.family, str(folder))  # VACE, Wan 2.2 I2V...
        if problem:
            raise ModelFolderError(problem)
        super(WanAdapter, cls.for_folder(folder)).check_folder(folder)

    @classmethod
    def load(cls, folder: Path, **settings) -> "WanAdapter":
        adapter_class = cls.for_folder(folder)
        if adapter_class is not cls:  # the folder's own adapter, which may load differently
            return adapter_class.load(folder, **settings)
        return super().load(folder, **settings)

    @property
    def vae_factor(self) -> int:
        return self.vae.config.scale_factor_spatial

    @property
    def latent_patch(self) -> int:
        return self.transformer.config.patch_size[-1]

    def sigma_shift(self, latent_height: int, latent_width: int) -> float:
        """The scheduler's flow_shift (3.0 in Wan 2.1's)."""
        return float(self.scheduler.config.flow_shift)

    def _latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean).view(shape)
        std = torch.tensor(config.latents_std).view(shape)
        return mean.to(like.device, like.dtype), std.to(like.device, like.dtype)

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] images or [B, 3, F, H, W] clips -> (mode - mean) / std, [B, C, F', h, w],
        the inverse of WanPipeline's latents * std + mean before decoding."""
        clips = as_clips(pixels.to(self.device, dtype=self.vae.dtype))
        latents = self.vae.encode(clips).latent_dist.mode()
        mean, std = self._latent_statistics(latents)
        return (latents - mean) / std

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 512, width]}: as WanPipeline._get_t5_prompt_embeds, the cleaned
        prompt through UMT5 with its mask, then zeros past each prompt's own tokens."""
        tokens = self.tokenizers[0]([prompt_clean(p) for p in prompts], padding="max_length",
                                    max_length=self.t5_max_length, truncation=True,
                                    add_special_tokens=True, return_attention_mask=True,
                                    return_tensors="pt")
        mask = tokens.attention_mask.to(self.device)
        embeds = self.text_encoders[0](tokens.input_ids.to(self.device), mask).last_hidden_state
        return {"prompt_embeds": embeds * mask.gt(0).unsqueeze(-1).to(embeds.dtype)}

    def network_timesteps(self, noisy: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
        """[B] timesteps sigma * 1000, as WanPipeline passes UniPC's."""
        return sigmas * self.scheduler.config.num_train_timesteps

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        if noisy.ndim != 5:
            raise ValueError(f"Wan latents are [B, C, F, h, w]; got shape {tuple(noisy.shape)} "
                             "(rebuild the latent cache with model_family wan)")
        timesteps = self.network_timesteps(noisy, sigmas)
        return network(timestep=timesteps.to(dtype),
                       encoder_hidden_states=batch.prompt_embeds["prompt_embeds"].to(dtype),
                       return_dict=False, **self._conditioned(noisy, batch, dtype))[0]

    def _conditioned(self, noisy: torch.Tensor, batch: TrainingBatch, dtype: torch.dtype
                     ) -> dict[str, torch.Tensor]:
        """The network's inputs besides the timestep and the prompt (text-to-video: the noisy
        latents alone)."""
        return {"hidden_states": noisy}
