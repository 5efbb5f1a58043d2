"""HunyuanVideo 1.5 text-to-video (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v
and -720p_t2v), trained on clips and on images as one-frame clips. Latents are [B, C, F, h, w]
from the causal 3D VAE (16x spatial, 4x temporal), scaled by its scaling_factor as
HunyuanVideo15Pipeline decodes them (latents / scaling_factor, no shift). Prompts are read by
the pipeline's own encode_prompt: Qwen2.5-VL's hidden states two layers from the top after its
system template (cropped at 108 tokens, 1000 kept, with their mask) and ByT5's embeddings of the
prompt's quoted text (zeros and an empty mask without quotes, 256 tokens). The transformer takes
the noisy latents followed by the pipeline's condition channels (zero latents and a zero mask
for text-to-video), the timestep sigma * 1000 (FlowMatchEulerDiscreteScheduler's), and zero
image embeddings of the pipeline's 729 tokens, which text-to-video masks out. An
image-to-video folder gets i2v.py's adapter (the spec names it)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import (AutoencoderKLHunyuanVideo15, HunyuanVideo15Pipeline,
                       HunyuanVideo15Transformer3DModel)
from diffusers.guiders import ClassifierFreeGuidance
from diffusers.loaders import HunyuanVideoLoraLoaderMixin
from transformers import AutoTokenizer, Qwen2_5_VLTextModel, T5EncoderModel

from simpletuner.families.hunyuanvideo.flavours import flavour_mismatch
from simpletuner.families.wan.adapter import as_clips
from simpletuner.models.flow_family import FLOW_TIMESTEPS, FlowFamilyAdapter
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.model_path import family_folder_problem
from simpletuner.models.training_batch import TrainingBatch

IMAGE_TOKENS = 729  # the pipeline's vision_num_semantic_tokens (SigLIP's 27 x 27 patches)
TEXT_TOKENS, GLYPH_TOKENS = 1000, 256  # its tokenizer_max_length and tokenizer_2_max_length


class HunyuanVideoAdapter(FlowFamilyAdapter):
    family = "hunyuanvideo"
    text_encoder_specs = (
        ("text_encoder", "tokenizer", Qwen2_5_VLTextModel, AutoTokenizer),
        ("text_encoder_2", "tokenizer_2", T5EncoderModel, AutoTokenizer))
    transformer_class = HunyuanVideo15Transformer3DModel
    pipeline_class = HunyuanVideo15Pipeline
    vae_class = AutoencoderKLHunyuanVideo15
    forbidden_subfolders = ("unet",)
    # diffusers 0.42 gives HunyuanVideo15Pipeline no LoRA loader: its transformer's own
    # load_lora_adapter(prefix="transformer") reads what this mixin writes (transformer. keys).
    lora_file_class = HunyuanVideoLoraLoaderMixin
    default_validation_frames = 121  # HunyuanVideo15Pipeline.__call__'s num_frames
    default_validation_framerate = 24  # HunyuanVideo 1.5's training and export rate

    def validation_arguments(self, arguments: dict) -> dict:
        """PIL frames; one frame unless ``arguments`` set num_frames (validation's clips do).
        The pipeline takes no guidance_scale: its guider holds it (validation_pipeline)."""
        arguments = {"num_frames": 1, **arguments, "output_type": "pil"}
        arguments["guidance_scale"] = None
        return arguments

    def validation_pipeline(self, pipeline, arguments: dict):
        """The pipeline with a guider of validation's guidance scale (1.0: no unconditional
        pass); the folder's guider, which the export saves, stays as it is."""
        pipeline.register_modules(guider=pipeline.guider.new(
            guidance_scale=arguments["guidance_scale"]))
        return pipeline

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        return flavour_mismatch(Path(folder), flavour)

    @classmethod
    def check_folder(cls, folder: Path) -> None:
        problem = family_folder_problem(cls.family, str(folder))
        if problem:
            raise ModelFolderError(problem)
        super(HunyuanVideoAdapter, cls.for_folder(folder)).check_folder(folder)

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + ("guider",)

    @classmethod
    def load(cls, folder: Path, **settings) -> "HunyuanVideoAdapter":
        adapter_class = cls.for_folder(folder)
        if adapter_class is not cls:  # the folder's own adapter
            return adapter_class.load(folder, **settings)
        return super().load(folder, **settings)

    @property
    def vae_factor(self) -> int:
        return self.vae.config.spatial_compression_ratio

    @property
    def latent_patch(self) -> int:
        return self.transformer.config.patch_size

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] images or [B, 3, F, H, W] clips -> mode * scaling_factor, one sample
        at a time as the pipeline encodes (diffusers 0.42's causal attention mask in the VAE's
        middle block does not broadcast over a batch)."""
        clips = as_clips(pixels.to(self.device, dtype=self.vae.dtype))
        latents = [self.vae.encode(clip).latent_dist.mode() for clip in clips.split(1)]
        return torch.cat(latents) * self.vae.config.scaling_factor

    def _text_pipeline(self) -> HunyuanVideo15Pipeline:
        """The pipeline class around the text encoders (and the VAE its constructor reads)."""
        return HunyuanVideo15Pipeline(transformer=None, scheduler=None, guider=None,
                                      vae=self.vae, **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 1000, width], "prompt_embeds_mask": [B, 1000],
        "prompt_embeds_2": [B, 256, width_2], "prompt_embeds_mask_2": [B, 256]}: the
        pipeline's encode_prompt."""
        embeds, mask, embeds_2, mask_2 = self._text_pipeline().encode_prompt(
            prompts, device=self.device, batch_size=len(prompts))
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask,
                "prompt_embeds_2": embeds_2, "prompt_embeds_mask_2": mask_2}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """Always 1000 and 256 tokens: the pipeline pads both prompts to them."""
        def rows(tokens: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
            return (torch.empty(count, tokens, width, device=self.device),
                    torch.ones(count, tokens, device=self.device))
        embeds, mask = rows(TEXT_TOKENS, self.text_encoders[0].config.hidden_size)
        embeds_2, mask_2 = rows(GLYPH_TOKENS, self.text_encoders[1].config.d_model)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask,
                "prompt_embeds_2": embeds_2, "prompt_embeds_mask_2": mask_2}

    def network_timesteps(self, sigmas: torch.Tensor) -> torch.Tensor:
        """[B] timesteps sigma * 1000, as the pipeline passes FlowMatchEuler's."""
        return sigmas * FLOW_TIMESTEPS

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        if noisy.ndim != 5:
            raise ValueError("HunyuanVideo latents are [B, C, F, h, w]; got shape "
                             f"{tuple(noisy.shape)} (rebuild the latent cache with model_family "
                             "hunyuanvideo)")
        embeds = batch.prompt_embeds
        condition, image_embeds = self._conditions(noisy, batch)
        return network(hidden_states=torch.cat([noisy, *condition], dim=1).to(dtype),
                       timestep=self.network_timesteps(sigmas).to(dtype),
                       encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
                       encoder_attention_mask=embeds["prompt_embeds_mask"].to(dtype),
                       encoder_hidden_states_2=embeds["prompt_embeds_2"].to(dtype),
                       encoder_attention_mask_2=embeds["prompt_embeds_mask_2"].to(dtype),
                       image_embeds=image_embeds.to(dtype), return_dict=False)[0]

    def _conditions(self, noisy: torch.Tensor, batch: TrainingBatch
                    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The condition latents and mask concatenated after the noisy latents, and the image
        embeddings: text-to-video's zeros (prepare_cond_latents_and_mask)."""
        count, _, frames, height, width = noisy.shape
        width_image = self.transformer.config.image_embed_dim
        return ((torch.zeros_like(noisy), noisy.new_zeros(count, 1, frames, height, width)),
                noisy.new_zeros(count, IMAGE_TOKENS, width_image))

    def _pipeline_components(self, trainable: torch.nn.Module | None) -> dict:
        """The folder's guider (a config file: the guidance scale), read for each pipeline."""
        return {**super()._pipeline_components(trainable),
                "guider": ClassifierFreeGuidance.from_pretrained(self.folder, subfolder="guider")}
