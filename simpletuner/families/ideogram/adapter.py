"""Ideogram 4 (ideogram-ai/ideogram-v4): a Qwen3-VL text encoder read through Ideogram4Pipeline's
own encode_prompt (the chat template, left-padded, thirteen decoder layers' hidden states
concatenated per token), FLUX.2 VAE latents packed 2x2 into tokens and normalised by the VAE's
batch norm in the token layout the pipeline decodes, and a transformer that reads the text
features and zero latents for the text positions followed by the image tokens, the pipeline's
position, segment and role ids, the timestep as 1 - sigma, and predicts latents - noise (the
pipeline steps with its negation). The unconditional transformer is frozen as loaded; the
prompt enhancer is not trained."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLFlux2, Ideogram4Pipeline, Ideogram4Transformer2DModel
from diffusers.models.transformers.transformer_ideogram4 import LLM_TOKEN_INDICATOR
from transformers import AutoTokenizer, Qwen3VLModel

from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.components import load_component
from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch

PATCH = 2  # the pipeline's patch_size


class IdeogramAdapter(FlowFamilyAdapter):
    family = "ideogram"
    text_encoder_specs = (("text_encoder", "tokenizer", Qwen3VLModel, AutoTokenizer),)
    transformer_class = Ideogram4Transformer2DModel
    pipeline_class = Ideogram4Pipeline
    vae_class = AutoencoderKLFlux2
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0")

    def __init__(self, *, unconditional_transformer=None, **parts):
        """``unconditional_transformer``: None where only the loss runs (the memory plan's
        meta adapter), which never calls it."""
        super().__init__(**parts)
        self.unconditional_transformer = unconditional_transformer

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + ("unconditional_transformer",)

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        network = load_component(cls.transformer_class.from_pretrained, folder,
                                 "unconditional_transformer")
        network.to(device, dtype=weight_dtype).requires_grad_(False).eval()
        return {"unconditional_transformer": network}

    def move_to(self, device: torch.device, except_modules=()) -> None:
        super().move_to(device, except_modules)
        if self.unconditional_transformer is not None:
            self.unconditional_transformer.to(device)

    @property
    def latent_patch(self) -> int:
        return PATCH

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 4C, H/16, W/16]: each 2x2 patch's channels in the pipeline's token order (row,
        column, channel), normalised by the batch norm as the pipeline undoes it."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        latents = self.vae.encode(pixels).latent_dist.mode()
        count, channels, height, width = latents.shape
        patches = latents.view(count, channels, height // PATCH, PATCH, width // PATCH, PATCH)
        patches = patches.permute(0, 3, 5, 1, 2, 4).reshape(
            count, PATCH * PATCH * channels, height // PATCH, width // PATCH)
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(patches)
        std = torch.sqrt(bn.running_var + self.vae.config.batch_norm_eps).view(1, -1, 1, 1)
        return (patches - mean) / std.to(patches)

    def validation_arguments(self, arguments: dict) -> dict:
        """The pipeline refuses a guidance_scale beside its default guidance_schedule (a weight
        per step): the configured scale replaces the schedule."""
        return {**arguments, "guidance_schedule": None}

    def _pipeline_components(self, trainable: torch.nn.Module | None) -> dict:
        return {**super()._pipeline_components(trainable),
                "unconditional_transformer": self.unconditional_transformer}

    def _text_pipeline(self) -> Ideogram4Pipeline:
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   unconditional_transformer=None,
                                   **self._pipeline_text_components())

    def _token_count(self, prompt: str) -> int:
        """The chat-templated prompt's tokens, as the pipeline's encode_prompt counts them."""
        tokenizer = self.tokenizers[0]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            add_generation_prompt=True, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T, features], "prompt_embeds_mask": [B, T]}: the pipeline's
        encode_prompt left-padded to the batch's longest prompt T, not to its 2048 tokens (the
        encoder is causal and masks the padding: the features are the same)."""
        longest = max(self._token_count(prompt) for prompt in prompts)
        features, _, _, indicator = self._text_pipeline().encode_prompt(
            prompts, 0, 0, max_sequence_length=longest, device=self.device)
        return {"prompt_embeds": features,
                "prompt_embeds_mask": (indicator == LLM_TOKEN_INDICATOR).to(torch.long)}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        tokens = self._token_count(PLANNED_CAPTION)
        width = self.transformer.config.llm_features_dim
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_embeds_mask": torch.ones(count, tokens, dtype=torch.long,
                                                 device=self.device)}

    @staticmethod
    def left_padded(features: torch.Tensor, mask: torch.Tensor
                    ) -> tuple[torch.Tensor, list[int]]:
        """Each row's prompt tokens moved to the end, as the pipeline lays its text out (cached
        rows of a batch come padded at the end); and their counts."""
        if features.is_meta:  # the memory plan: its captions are unpadded
            return features, [features.shape[1]] * features.shape[0]
        lengths = [int(n) for n in mask.to(torch.long).sum(dim=1)]
        longest = max(lengths)
        padded = features.new_zeros(features.shape[0], longest, features.shape[2])
        for row, length in enumerate(lengths):
            padded[row, longest - length:] = features[row][mask[row].bool()]
        return padded, lengths

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        count, channels, rows, columns = noisy.shape
        embeds = batch.prompt_embeds
        text, lengths = self.left_padded(embeds["prompt_embeds"], embeds["prompt_embeds_mask"])
        positions, segments, roles = Ideogram4Pipeline._prepare_ids(
            lengths, rows, columns, text.shape[1], noisy.device)
        tokens = noisy.flatten(2).transpose(1, 2)
        text_latents = tokens.new_zeros(count, text.shape[1], channels)
        image_features = text.new_zeros(count, rows * columns, text.shape[2])
        output = network(hidden_states=torch.cat([text_latents, tokens], dim=1),
                         timestep=(1.0 - sigmas).to(dtype),  # the pipeline's model time
                         encoder_hidden_states=torch.cat([text, image_features], dim=1).to(dtype),
                         position_ids=positions, segment_ids=segments, indicator=roles,
                         return_dict=False)[0]
        velocity = output[:, text.shape[1]:]
        return -velocity.transpose(1, 2).reshape(count, channels, rows, columns)
