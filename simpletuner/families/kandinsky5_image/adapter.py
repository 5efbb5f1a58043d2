"""Kandinsky 5.0 Image Lite (kandinskylab/Kandinsky-5.0-T2I-Lite-*-Diffusers): Qwen2.5-VL's last
hidden states after the pipeline's prompt template and CLIP's pooled embedding, both read through
Kandinsky5T2IPipeline's own encode_prompt, Flux VAE latents scaled but not shifted (the pipeline
decodes latents / scaling_factor), and a transformer that reads [B, 1, H, W, C] latents, the
timestep 1000 * sigma as the pipeline's scheduler gives it, and predicts noise - latents.

The transformer has no text mask: the pipeline encodes a prompt unpadded and attends to all of
its tokens. Captions are cached unpadded with a mask, and a batch whose captions differ in
length runs the network once per length (models/caption_lengths.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import Kandinsky5T2IPipeline, Kandinsky5Transformer3DModel
from transformers import (AutoTokenizer, CLIPTextModel, CLIPTokenizer,
                          Qwen2_5_VLForConditionalGeneration)

from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.caption_lengths import per_caption_length
from simpletuner.models.flow_family import FLOW_TIMESTEPS, FlowFamilyAdapter
from simpletuner.models.model_index import pipeline_class_name
from simpletuner.models.training_batch import TrainingBatch


I2I_PIPELINE = "Kandinsky5I2IPipeline"


class EverySize(list):
    """The pipeline's resolution table that holds every size: Kandinsky5T2IPipeline moves a
    size it does not list to the nearest of its seven 1 MP sizes; validation samples at the
    size asked for (a bucket already), as SimpleTuner's copy of the pipeline does."""

    def __contains__(self, size) -> bool:
        return True


class Kandinsky5ImageAdapter(FlowFamilyAdapter):
    family = "kandinsky5_image"
    text_encoder_specs = (
        ("text_encoder", "tokenizer", Qwen2_5_VLForConditionalGeneration, AutoTokenizer),
        ("text_encoder_2", "tokenizer_2", CLIPTextModel, CLIPTokenizer))
    transformer_class = Kandinsky5Transformer3DModel
    pipeline_class = Kandinsky5T2IPipeline
    forbidden_subfolders = ("unet", "text_encoder_3")  # UNet families, SD3
    # SimpleTuner's default: the query, key and value projections of every block.
    lora_target_modules = ("to_query", "to_key", "to_value")
    max_sequence_length = 512  # the pipeline's default

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        """SimpleTuner's i2i flavours train a Kandinsky5I2IPipeline folder (on edit pairs),
        its t2i flavours (and none) a Kandinsky5T2IPipeline folder."""
        found = pipeline_class_name(folder)
        image_to_image = flavour is not None and flavour.startswith("i2i")
        if image_to_image == (found == I2I_PIPELINE):
            return None
        if image_to_image:
            return (f"'{flavour}' trains a {I2I_PIPELINE} model, but the model_index.json of "
                    f"{folder} names {found}; use a Kandinsky 5.0 I2I folder (or "
                    "builtin:tiny-kandinsky5_image-i2i), or a t2i flavour")
        return (f"{folder} is a {I2I_PIPELINE} model; set model_flavour 'i2i-lite-sft' or "
                "'i2i-lite-pretrain' (and give its datasets conditioning_data)")

    @classmethod
    def load(cls, folder: Path, **settings) -> "Kandinsky5ImageAdapter":
        return super(Kandinsky5ImageAdapter, cls.for_folder(folder)).load(folder, **settings)

    @property
    def latent_patch(self) -> int:
        return self.transformer.config.patch_size[-1]  # (frames, rows, columns)

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        return self.vae.encode(pixels).latent_dist.mode() * self.vae.config.scaling_factor

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        pipeline = super().build_pipeline(trainable)
        pipeline.resolutions = EverySize(pipeline.resolutions)
        return pipeline

    def _text_pipeline(self) -> Kandinsky5T2IPipeline:
        """The pipeline class around the loaded text encoders alone, to call encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T, width], "prompt_attention_mask": [B, T],
        "pooled_prompt_embeds": [B, CLIP width]}: each prompt through the pipeline's
        encode_prompt alone (unpadded, as the pipeline encodes one prompt), then padded at the
        end to the longest, with its mask."""
        pipeline = self._text_pipeline()
        return self._padded([pipeline.encode_prompt(
            prompt, max_sequence_length=self.max_sequence_length, device=self.device)
            for prompt in prompts])

    def _padded(self, rows: list[tuple]) -> dict[str, torch.Tensor]:
        """encode_prompt's (embeds, pooled, lengths) of one prompt each, as encode_prompts
        returns them."""
        longest = max(embeds.shape[1] for embeds, _, _ in rows)
        embeds = torch.zeros(len(rows), longest, rows[0][0].shape[-1], device=self.device,
                             dtype=rows[0][0].dtype)
        mask = torch.zeros(len(rows), longest, dtype=torch.long, device=self.device)
        for row, (features, _, _) in enumerate(rows):
            embeds[row, :features.shape[1]] = features[0]
            mask[row, :features.shape[1]] = 1
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask,
                "pooled_prompt_embeds": torch.cat([pooled for _, pooled, _ in rows])}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """A typical caption's tokens after the template, as encode_prompt keeps them."""
        pipeline = self._text_pipeline()
        text = pipeline.prompt_template.format(PLANNED_CAPTION)
        tokens = min(len(self.tokenizers[0](text).input_ids)
                     - pipeline.prompt_template_encode_start_idx, self.max_sequence_length)
        return self.planned_embeds(count, tokens)

    def planned_embeds(self, count: int, tokens: int) -> dict[str, torch.Tensor]:
        """What the cache holds for ``count`` captions of ``tokens`` tokens, on the device."""
        width = self.text_encoders[0].config.text_config.hidden_size
        pooled = self.text_encoders[1].config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_attention_mask": torch.ones(count, tokens, dtype=torch.long,
                                                    device=self.device),
                "pooled_prompt_embeds": torch.empty(count, pooled, device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        text, pooled = embeds["prompt_embeds"], embeds["pooled_prompt_embeds"]

        def predict(rows: torch.Tensor, length: int) -> torch.Tensor:
            return self._call(network, self._visual_input(noisy, batch, rows), sigmas[rows],
                              text[rows, :length], pooled[rows], dtype)

        return per_caption_length(embeds["prompt_attention_mask"], predict)

    def _visual_input(self, noisy: torch.Tensor, batch: TrainingBatch,
                      rows: torch.Tensor) -> torch.Tensor:
        """[B, 1, H, W, C]: the latents of ``rows`` as the pipeline lays them out
        (image-to-image adds its condition's channels)."""
        return noisy[rows].permute(0, 2, 3, 1).unsqueeze(1)

    def _call(self, network, visual: torch.Tensor, sigmas: torch.Tensor, text: torch.Tensor,
              pooled: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The network on latents whose captions all have text.shape[1] tokens, as the
        pipeline calls it (its rope positions, scale factors 1)."""
        _, _, height, width, _ = visual.shape
        device, patch = visual.device, self.latent_patch
        visual_positions = [torch.arange(1, device=device),
                            torch.arange(height // patch, device=device),
                            torch.arange(width // patch, device=device)]
        output = network(hidden_states=visual.to(dtype),
                         encoder_hidden_states=text.to(dtype),
                         pooled_projections=pooled.to(dtype),
                         timestep=(sigmas * FLOW_TIMESTEPS).to(dtype),
                         visual_rope_pos=visual_positions,
                         text_rope_pos=torch.arange(text.shape[1], device=device),
                         scale_factor=(1.0, 1.0, 1.0), sparse_params=None,
                         return_dict=False)  # the tensor itself, not a tuple
        return output.squeeze(1).permute(0, 3, 1, 2)
