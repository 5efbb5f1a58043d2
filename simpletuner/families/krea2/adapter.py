"""Krea 2 (krea/Krea-2): a Qwen3-VL text encoder read through Krea2Pipeline's own encode_prompt
(its template padded to a fixed 512 tokens in the middle, the hidden states of several layers
stacked per token, the system prefix dropped, a boolean mask), the Qwen-Image VAE (one-frame
latents normalised by latents_mean/std), and a single-stream transformer on latents packed 2x2
with (frame, row, column) rotary positions; its timestep is sigma and it predicts noise -
latents, which the pipeline's Euler step takes as is."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLQwenImage, Krea2Pipeline, Krea2Transformer2DModel
from transformers import AutoTokenizer, Qwen3VLModel

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.model_index import read_model_index
from simpletuner.models.training_batch import TrainingBatch

# Krea2Pipeline's own settings in model_index.json (the tapped layers, the distilled
# checkpoint's fixed shift, the packing), passed back when a pipeline is built.
PIPELINE_SETTINGS = ("text_encoder_select_layers", "is_distilled", "patch_size")
MAX_SEQUENCE_LENGTH = 512  # Krea2Pipeline's default


class Krea2Adapter(FlowFamilyAdapter):
    family = "krea2"
    text_encoder_specs = (("text_encoder", "tokenizer", Qwen3VLModel, AutoTokenizer),)
    transformer_class = Krea2Transformer2DModel
    pipeline_class = Krea2Pipeline
    vae_class = AutoencoderKLQwenImage
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    # The attention projections of every joint block (the text-fusion blocks stay frozen).
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def swappable_blocks(cls, network: torch.nn.Module) -> list[torch.nn.Module]:
        """The joint blocks; the text fusion runs before them, on the device."""
        return list(network.transformer_blocks)

    @property
    def vae_factor(self) -> int:
        return 2 ** len(self.vae.temperal_downsample)  # as Krea2Pipeline computes it

    @property
    def latent_patch(self) -> int:
        return self._pipeline_settings().get("patch_size", 2)

    def _pipeline_settings(self) -> dict:
        index = read_model_index(self.folder)
        return {name: index[name] for name in PIPELINE_SETTINGS if name in index}

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, 16, H/8, W/8]: the VAE's one-frame mode, (z - mean) / std, which
        the pipeline undoes before decoding."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype).unsqueeze(2)
        latents = self.vae.encode(pixels).latent_dist.mode()[:, :, 0]
        config = self.vae.config
        mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1).to(latents)
        std = torch.tensor(config.latents_std).view(1, -1, 1, 1).to(latents)
        return (latents - mean) / std

    def build_pipeline(self, trainable: torch.nn.Module | None = None) -> Krea2Pipeline:
        return self.pipeline_class(**self._pipeline_components(trainable),
                                   **self._pipeline_settings())

    def _text_pipeline(self) -> Krea2Pipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components(),
                                   **self._pipeline_settings())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 512, layers, width], "prompt_embeds_mask": [B, 512] bool}: the
        pipeline's encode_prompt."""
        embeds, mask = self._text_pipeline().encode_prompt(
            prompts, device=self.device, max_sequence_length=MAX_SEQUENCE_LENGTH)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """Every caption comes out the same length: the padded prompt less the suffix tokens
        the pipeline assumes, plus its template's suffix as the folder's tokenizer counts it."""
        pipeline = self._text_pipeline()
        suffix = len(self.tokenizers[0](pipeline.prompt_template_encode_suffix).input_ids)
        tokens = MAX_SEQUENCE_LENGTH - pipeline.prompt_template_encode_num_suffix_tokens + suffix
        layers = len(pipeline.text_encoder_select_layers)
        width = self.text_encoders[0].config.text_config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, layers, width, device=self.device),
                "prompt_embeds_mask": torch.ones(count, tokens, dtype=torch.bool,
                                                 device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        count, channels, height, width = noisy.shape
        patch = self.latent_patch
        embeds = batch.prompt_embeds
        text = embeds["prompt_embeds"].to(dtype)
        positions = Krea2Pipeline.prepare_position_ids(
            text.shape[1], height // patch, width // patch, noisy.device)
        packed = self._pack(noisy, patch)
        tokens = network(hidden_states=packed, encoder_hidden_states=text,
                         timestep=sigmas.to(dtype), position_ids=positions,
                         encoder_attention_mask=embeds["prompt_embeds_mask"].to(torch.bool),
                         return_dict=False)[0]
        return self._unpack(tokens, patch, channels, height, width)

    @staticmethod
    def _pack(latents: torch.Tensor, patch: int) -> torch.Tensor:
        """[B, C, h, w] -> [B, (h/p)(w/p), C p p], the layout of the pipeline's _pack_latents."""
        count, channels, height, width = latents.shape
        latents = latents.view(count, channels, height // patch, patch, width // patch, patch)
        return latents.permute(0, 2, 4, 1, 3, 5).reshape(
            count, (height // patch) * (width // patch), channels * patch * patch)

    @staticmethod
    def _unpack(tokens: torch.Tensor, patch: int, channels: int, height: int,
                width: int) -> torch.Tensor:
        count = tokens.shape[0]
        tokens = tokens.view(count, height // patch, width // patch, channels, patch, patch)
        return tokens.permute(0, 3, 1, 4, 2, 5).reshape(count, channels, height, width)
