"""Qwen-Image 2.1 (model_family qwen_image, model_flavour v2.1): a Qwen3-VL text encoder read
through QwenImage21Pipeline's own encode_prompt (its raw template, left-padded, the last
decoder layer before the final norm, the system tokens dropped, a mask over the valid tokens),
an RGBA 64-channel VAE with 16x compression whose one-frame latents are normalised by
latents_mean/std and enter the transformer unpatched, one token per latent pixel, and a
single-stream block-causal transformer: the text and the target image's slots (one per 2x2
latent tokens) form one sequence, the timestep is sigma and the image tokens come last in the
output. Text-to-image only: the pipeline's condition images are not trained."""

from __future__ import annotations

import torch
from diffusers import (AutoencoderKLQwenImage21, QwenImage21Pipeline,
                       QwenImage21Transformer2DModel)
from transformers import Qwen3VLForConditionalGeneration

from simpletuner.families.qwen_image.adapter import QwenImageAdapter
from simpletuner.families.qwen_image.v21_processor import (PIPELINE_ENTRY,
                                                            ImageTextQwen3VLProcessor)
from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.model_index import read_model_index
from simpletuner.models.training_batch import TrainingBatch

SLOT_SIDE = 2  # each of the text encoder's image slots stands for 2x2 latent tokens


class QwenImage21Adapter(QwenImageAdapter):
    text_encoder_specs = (("text_encoder", "processor", Qwen3VLForConditionalGeneration,
                           ImageTextQwen3VLProcessor),)
    transformer_class = QwenImage21Transformer2DModel
    pipeline_class = QwenImage21Pipeline
    vae_class = AutoencoderKLQwenImage21
    # Every block's output feeds the next: nothing goes unused.
    ddp_find_unused_parameters = False

    @classmethod
    def swappable_blocks(cls, network: torch.nn.Module) -> list[torch.nn.Module]:
        return list(network.transformer_blocks)

    @property
    def latent_patch(self) -> int:
        return 1  # the pipeline packs latents unpatched: one token per latent pixel

    @property
    def resolution_alignment(self) -> int:
        return self.vae_factor * SLOT_SIDE  # the pipeline's multiple_of: whole 2x2 slots

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """The VAE reads RGBA, as the pipeline hands it condition images: a training image is
        opaque (alpha 1 in [-1, 1])."""
        missing = self.vae.config.in_channels - pixels.shape[1]
        if missing > 0:
            count, _, height, width = pixels.shape
            pixels = torch.cat([pixels, pixels.new_ones(count, missing, height, width)], dim=1)
        return super().encode_images(pixels)

    def build_pipeline(self, trainable: torch.nn.Module | None = None) -> QwenImage21Pipeline:
        """With the folder's sample_sigmas, the author's default sampling grid, and the processor
        named as the class its folder is for."""
        sigmas = read_model_index(self.folder).get("sample_sigmas")
        pipeline = self.pipeline_class(**self._pipeline_components(trainable),
                                       sample_sigmas=sigmas)
        pipeline.register_to_config(processor=PIPELINE_ENTRY)
        return pipeline

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T, width], "prompt_embeds_mask": [B, T]}: the pipeline's
        encode_prompt without condition images, shorter prompts zero-padded at the end with a
        zero mask (none when nothing is padded: here, all ones)."""
        embeds, mask, _ = self._text_pipeline().encode_prompt(prompts, device=self.device)
        if mask is None:
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """The template's tokens around the caption less the system tokens the pipeline drops,
        as the folder's tokenizer counts them."""
        pipeline = self._text_pipeline()
        text = pipeline.prompt_template_t2i.format(PLANNED_CAPTION)
        tokens = len(self.tokenizers[0].tokenizer(text).input_ids) - pipeline._drop_idx
        width = self.text_encoders[0].config.text_config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_embeds_mask": torch.ones(count, tokens, dtype=torch.long,
                                                 device=self.device)}

    @staticmethod
    def image_slots_mask(count: int, text_tokens: int, image_tokens: int,
                         device: torch.device) -> torch.Tensor:
        """img_mask as the pipeline builds it for text-to-image: no image slot among the text,
        then one slot per 2x2 group of the target's latent tokens."""
        slots = image_tokens // (SLOT_SIDE * SLOT_SIDE)
        return torch.cat([torch.zeros(count, text_tokens, dtype=torch.bool, device=device),
                          torch.ones(count, slots, dtype=torch.bool, device=device)], dim=1)

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        count, channels, height, width = noisy.shape
        embeds = batch.prompt_embeds
        text = embeds["prompt_embeds"].to(dtype)
        packed = QwenImage21Pipeline._pack_latents(noisy, count, channels, height, width)
        # The slots' layout sizes the joint sequence, so the memory plan (on the meta device,
        # where nothing has values) needs it with values: it depends on the shapes alone.
        mask_device = torch.device("cpu") if noisy.is_meta else noisy.device
        output = network(
            hidden_states=packed, timestep=sigmas.to(dtype), encoder_hidden_states=text,
            encoder_hidden_states_mask=embeds["prompt_embeds_mask"].to(torch.bool),
            img_shapes=[[(1, height, width)]] * count,
            img_mask=self.image_slots_mask(count, text.shape[1], height * width, mask_device),
            return_dict=False)[0]
        # The target image's tokens close the joint sequence.
        tokens = output[:, -height * width:]
        return tokens.transpose(1, 2).reshape(count, channels, height, width)
