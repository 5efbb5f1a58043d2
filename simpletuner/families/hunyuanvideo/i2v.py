"""HunyuanVideo 1.5 image-to-video (HunyuanVideo-1.5-Diffusers-480p_i2v and -720p_i2v): the
text-to-video adapter plus what HunyuanVideo15ImageToVideoPipeline gives its transformer. Each
sample's first frame is its conditioning image: its VAE latents, encoded alone as the pipeline's
_get_image_latents encodes the image, and SigLIP's last hidden states of it (encode_image), both
cached with the sample's latents. The transformer takes the noisy latents, then those latents
on latent frame 0 and zeros after it, then a mask of ones on frame 0, and the image embeddings
(unmasked, as they are not all zero). Every latent frame is denoised, so the loss covers all."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import HunyuanVideo15ImageToVideoPipeline
from transformers import SiglipImageProcessor, SiglipVisionModel

from simpletuner.families.hunyuanvideo.adapter import HunyuanVideoAdapter
from simpletuner.families.wan.adapter import as_clips
from simpletuner.families.wan.i2v import as_pil_images
from simpletuner.models.components import load_component
from simpletuner.models.training_batch import TrainingBatch

IMAGE_PARTS = ("image_encoder", "feature_extractor")


class HunyuanVideoI2VAdapter(HunyuanVideoAdapter):
    pipeline_class = HunyuanVideo15ImageToVideoPipeline
    validates_from_image = True
    trains_image_to_video = True  # every dataset, is_i2v or not

    def __init__(self, *, image_encoder, feature_extractor, **parts):
        super().__init__(**parts)
        self.image_encoder = image_encoder
        self.feature_extractor = feature_extractor

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + IMAGE_PARTS

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        encoder = load_component(SiglipVisionModel.from_pretrained, folder, "image_encoder")
        encoder.to(device, dtype=weight_dtype).requires_grad_(False).eval()
        extractor = load_component(SiglipImageProcessor.from_pretrained, folder,
                                   "feature_extractor")
        return {"image_encoder": encoder, "feature_extractor": extractor}

    def move_to(self, device: torch.device,
                except_modules: list[torch.nn.Module] | tuple = ()) -> None:
        super().move_to(device, except_modules)
        self.image_encoder.to(device)

    @torch.no_grad()
    def encode_image_embeds(self, frames: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] first frames -> [B, tokens, width]: the pipeline's _get_image_embeds."""
        inputs = self.feature_extractor.preprocess(images=as_pil_images(frames), do_resize=True,
                                                   return_tensors="pt", do_convert_rgb=True)
        pixels = inputs.pixel_values.to(self.device, self.image_encoder.dtype)
        return self.image_encoder(pixel_values=pixels).last_hidden_state

    @torch.no_grad()
    def encode_for_cache(self, pixels: torch.Tensor, first_frame_condition: bool = False
                         ) -> dict[str, torch.Tensor]:
        """The sample's latents, its first frame's latents (``image_latents``, encoded alone)
        and SigLIP embedding (``image_embeds``)."""
        clips = as_clips(pixels)
        first = clips[:, :, :1]
        return {"latent": self.encode_images(clips), "image_latents": self.encode_images(first),
                "image_embeds": self.encode_image_embeds(first[:, :, 0])}

    def _conditions(self, noisy: torch.Tensor, batch: TrainingBatch
                    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        conditioning = batch.conditioning
        if "image_latents" not in conditioning:
            raise ValueError("this HunyuanVideo image-to-video batch has no cached first-frame "
                             "conditioning (rebuild the latent cache with this model)")
        condition = torch.zeros_like(noisy)
        condition[:, :, :1] = conditioning["image_latents"].to(noisy.dtype)
        mask = torch.zeros_like(noisy[:, :1])
        mask[:, :, 0] = 1
        return (condition, mask), conditioning["image_embeds"].to(noisy.dtype)

    def _pipeline_components(self, trainable: torch.nn.Module | None) -> dict:
        return {**super()._pipeline_components(trainable), "image_encoder": self.image_encoder,
                "feature_extractor": self.feature_extractor}
