"""SDXL ControlNet training (controlnet: true): a ControlNetModel beside the frozen UNet, its
residuals added to the UNet's as StableDiffusionXLControlNetPipeline adds them; control images
are kept as pixels in [0, 1], as the pipeline gives them to the ControlNet."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import ControlNetModel, StableDiffusionXLControlNetPipeline

from simpletuner.families.sdxl.adapter import SDXLAdapter
from simpletuner.models.controlnet import ControlNetTraining
from simpletuner.models.training_batch import TrainingBatch


class SDXLControlNetAdapter(ControlNetTraining, SDXLAdapter):
    base_network = "unet"
    pipeline_class = StableDiffusionXLControlNetPipeline

    def load_controlnet(self, folder: Path) -> torch.nn.Module:
        return ControlNetModel.from_pretrained(folder)

    def controlnet_from(self, base: torch.nn.Module) -> torch.nn.Module:
        return ControlNetModel.from_unet(base)

    def encode_control(self, pixels: torch.Tensor) -> torch.Tensor:
        return ((pixels.float() + 1.0) / 2.0).clamp(0.0, 1.0)

    def _predict(self, network, noisy: torch.Tensor, timesteps: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        conditioning = self._unet_conditioning(batch, dtype)
        down, middle = network(noisy, timesteps, controlnet_cond=batch.control.to(dtype),
                               return_dict=False, **conditioning)
        return self.unet(noisy, timesteps, return_dict=False,
                         down_block_additional_residuals=[r.to(dtype) for r in down],
                         mid_block_additional_residual=middle.to(dtype), **conditioning)[0]
