"""Kandinsky 5.0 Image Lite image-to-image (model_flavour i2i-lite-sft or i2i-lite-pretrain, a
Kandinsky5I2IPipeline folder), trained on edit pairs as the pipeline gives its transformer each
pair: Qwen2.5-VL reads the caption with the reference image (the pipeline's processor, its
template's image slot, the image at half its side), and the transformer (visual_cond) reads the
noisy latents, the reference's latents and a mask channel of ones, concatenated per latent
pixel. The pipeline encodes the reference with a sample of the VAE's distribution; the cache
keeps its mode, as it keeps every latent."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import Kandinsky5I2IPipeline
from PIL import Image
from transformers import CLIPTextModel, CLIPTokenizer, Qwen2_5_VLForConditionalGeneration

from simpletuner.families.kandinsky5_image.adapter import Kandinsky5ImageAdapter
from simpletuner.families.qwen_image.processor import PIPELINE_ENTRY, load_processor
from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.training_batch import TrainingBatch

PLANNED_SIDE = 1024  # the memory plan's reference: the pipeline's 1 MP sizes


class ProcessorFolder:
    """The torchvision-free Qwen2VLProcessor of a tokenizer/ folder, loaded as the components
    loader (folder, subfolder) and the memory plan (the subfolder's path) ask for it."""

    @staticmethod
    def from_pretrained(folder, subfolder: str | None = None):
        folder = Path(folder)
        if subfolder is None:
            folder, subfolder = folder.parent, folder.name
        return load_processor(folder, subfolder)


class Kandinsky5ImageI2IAdapter(Kandinsky5ImageAdapter):
    text_encoder_specs = (
        ("text_encoder", "tokenizer", Qwen2_5_VLForConditionalGeneration, ProcessorFolder),
        ("text_encoder_2", "tokenizer_2", CLIPTextModel, CLIPTokenizer))
    pipeline_class = Kandinsky5I2IPipeline
    prompts_see_references = True  # the text cache keys each caption by its reference too
    max_sequence_length = 1024  # the pipeline's default

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        pipeline = super().build_pipeline(trainable)
        pipeline.register_to_config(tokenizer=PIPELINE_ENTRY)  # what its export's folder holds
        return pipeline

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str],
                       references: list[list[Image.Image]] | None = None
                       ) -> dict[str, torch.Tensor]:
        """As text-to-image's, each prompt read with its one reference image."""
        if references is None or len(references) != len(prompts) or any(
                len(images) != 1 for images in references):
            raise ValueError("Kandinsky5I2IPipeline reads each prompt with one reference "
                             f"image: got {len(prompts)} prompts and "
                             f"{'no' if references is None else len(references)} references")
        pipeline = self._text_pipeline()
        return self._padded([
            pipeline.encode_prompt(prompt, image=image,
                                   max_sequence_length=self.max_sequence_length,
                                   device=self.device)
            for prompt, (image,) in zip(prompts, references)])

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """A typical caption and a 1 MP reference's image tokens (read at half the side)."""
        pipeline = self._text_pipeline()
        image = Image.new("RGB", (PLANNED_SIDE // 2, PLANNED_SIDE // 2))
        ids = self.tokenizers[0](text=[pipeline.prompt_template.format(PLANNED_CAPTION)],
                                 images=[image], return_tensors="pt")["input_ids"]
        return self.planned_embeds(count, ids.shape[1] - pipeline.prompt_template_encode_start_idx)

    def _visual_input(self, noisy: torch.Tensor, batch: TrainingBatch,
                      rows: torch.Tensor) -> torch.Tensor:
        """The noisy latents, the reference's and a mask of ones, channels last."""
        latents = super()._visual_input(noisy, batch, rows)
        if not batch.reference_latents:  # the memory plan's batch: no reference cached
            condition = torch.zeros_like(latents)
        else:
            (reference,) = batch.reference_latents
            condition = super()._visual_input(reference.to(noisy.dtype), batch, rows)
        return torch.cat([latents, condition, torch.ones_like(latents[..., :1])], dim=-1)
