"""Flux ControlNet training (controlnet: true): a FluxControlNetModel beside the frozen
transformer, its block samples added to the transformer's as FluxControlNetPipeline adds them;
control images are kept as VAE latents, packed like the noisy image for the ControlNet, as the
pipeline encodes them."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import FluxControlNetModel, FluxControlNetPipeline

from simpletuner.families.flux.adapter import FluxAdapter, image_tokens, pack_latents
from simpletuner.models.controlnet import ControlNetTraining
from simpletuner.models.training_batch import TrainingBatch

# diffusers' FluxControlNetModel.from_transformer defaults: blocks copied from the transformer.
DOUBLE_BLOCKS, SINGLE_BLOCKS = 4, 10


class FluxControlNetAdapter(ControlNetTraining, FluxAdapter):
    base_network = "transformer"
    pipeline_class = FluxControlNetPipeline
    reference_image_argument = "control_image"

    @classmethod
    def load(cls, folder: Path, **settings) -> "FluxControlNetAdapter":
        return super(FluxAdapter, cls).load(folder, **settings)  # this class, not a flavour's

    def load_controlnet(self, folder: Path) -> torch.nn.Module:
        return FluxControlNetModel.from_pretrained(folder)

    def controlnet_from(self, base: torch.nn.Module) -> torch.nn.Module:
        config = base.config
        return FluxControlNetModel.from_transformer(
            base, num_layers=min(DOUBLE_BLOCKS, config.num_layers),
            num_single_layers=min(SINGLE_BLOCKS, config.num_single_layers),
            attention_head_dim=config.attention_head_dim,
            num_attention_heads=config.num_attention_heads)

    def encode_control(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.encode_images(pixels)

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        inputs = self._transformer_inputs(noisy, sigmas, batch, dtype)
        double, single = network(controlnet_cond=pack_latents(batch.control.to(dtype)),
                                 **inputs)
        tokens = self.transformer(**inputs, controlnet_block_samples=double,
                                  controlnet_single_block_samples=single,
                                  controlnet_blocks_repeat=False)[0]
        return image_tokens(tokens, noisy)
