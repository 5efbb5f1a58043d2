"""Wan 2.1 image-to-video (Wan-AI/Wan2.1-I2V-14B-480P and -720P): the text-to-video adapter
plus what WanImageToVideoPipeline gives its transformer besides the noisy latents. Each sample's
first frame is its conditioning image: the VAE latents of that frame followed by black frames
(the pipeline's ``prepare_latents``), and the CLIP image encoder's penultimate hidden states of
it (``encode_image``), both cached with the sample's latents. The transformer takes the noisy
latents, a mask marking latent frame 0 as given and those condition latents, concatenated on
channels (16 + 4 + 16), and the image embedding as ``encoder_hidden_states_image``. Every
latent frame is denoised by the pipeline, frame 0 included, so the loss covers every frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from diffusers import WanImageToVideoPipeline
from PIL import Image
from transformers import CLIPImageProcessor, CLIPVisionModel

from simpletuner.families.wan.adapter import WanAdapter, as_clips
from simpletuner.models.components import load_component
from simpletuner.models.training_batch import TrainingBatch

IMAGE_PARTS = ("image_encoder", "image_processor")


def first_frame_mask(latents: torch.Tensor, channels: int) -> torch.Tensor:
    """[B, channels, F', h, w]: ones on latent frame 0 (the given image), zeros after it, as
    the pipeline's mask_lat_size for one conditioning image."""
    batch, _, frames, height, width = latents.shape
    mask = latents.new_zeros(batch, channels, frames, height, width)
    mask[:, :, 0] = 1
    return mask


def as_pil_images(frames: torch.Tensor) -> list[Image.Image]:
    """[B, 3, H, W] in [-1, 1] -> RGB images, as the pipeline is given its image."""
    values = ((frames.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return [Image.fromarray(np.ascontiguousarray(v.permute(1, 2, 0).cpu().numpy()))
            for v in values]


class WanI2VAdapter(WanAdapter):
    pipeline_class = WanImageToVideoPipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3, Flux
    validates_from_image = True
    trains_image_to_video = True  # every dataset, is_i2v or not

    def __init__(self, *, image_encoder, image_processor, **parts):
        super().__init__(**parts)
        self.image_encoder = image_encoder
        self.image_processor = image_processor

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + IMAGE_PARTS

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        encoder = load_component(CLIPVisionModel.from_pretrained, folder, "image_encoder")
        encoder.to(device, dtype=weight_dtype).requires_grad_(False).eval()
        processor = load_component(CLIPImageProcessor.from_pretrained, folder,
                                   "image_processor")
        return {"image_encoder": encoder, "image_processor": processor}

    def move_to(self, device: torch.device,
                except_modules: list[torch.nn.Module] | tuple = ()) -> None:
        super().move_to(device, except_modules)
        self.image_encoder.to(device)

    @property
    def mask_channels(self) -> int:
        """The mask's channels: the VAE's temporal factor (4 pixel frames per latent frame)."""
        return self.vae.config.scale_factor_temporal

    @torch.no_grad()
    def encode_image_embeds(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] first frames -> [B, tokens, width]: the pipeline's encode_image."""
        inputs = self.image_processor(images=as_pil_images(frames), return_tensors="pt")
        pixels = inputs.pixel_values.to(self.device, self.image_encoder.dtype)
        return self.image_encoder(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]

    @torch.no_grad()
    def encode_for_cache(self, pixels: torch.Tensor, first_frame_condition: bool = False
                         ) -> dict[str, torch.Tensor]:
        """The sample's latents, the latents of its first frame followed by black frames
        (``image_latents``, normalised as the latents are) and its first frame's CLIP
        embedding (``image_embeds``); every dataset is image-to-video for this folder."""
        clips = as_clips(pixels)
        first = clips[:, :, :1]
        condition = torch.cat([first, torch.zeros_like(clips[:, :, 1:])], dim=2)
        return {"latent": self.encode_images(clips), "image_latents": self.encode_images(condition),
                "image_embeds": self.encode_image_embeds(first[:, :, 0])}

    def _conditioned(self, noisy: torch.Tensor, batch: TrainingBatch, dtype: torch.dtype
                     ) -> dict[str, torch.Tensor]:
        conditioning = batch.conditioning
        if "image_latents" not in conditioning:
            raise ValueError("this Wan image-to-video batch has no cached first-frame "
                             "conditioning (rebuild the latent cache with this model)")
        mask = first_frame_mask(noisy, self.mask_channels)
        hidden = torch.cat([noisy, mask, conditioning["image_latents"].to(noisy.dtype)], dim=1)
        return {"hidden_states": hidden.to(dtype),
                "encoder_hidden_states_image": conditioning["image_embeds"].to(dtype)}

    def _pipeline_components(self, trainable: torch.nn.Module | None) -> dict:
        return {**super()._pipeline_components(trainable), "image_encoder": self.image_encoder,
                "image_processor": self.image_processor}
