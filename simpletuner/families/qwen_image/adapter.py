"""Qwen-Image: a Qwen2.5-VL text encoder read through QwenImagePipeline's own encode_prompt
(chat template, its first 34 tokens dropped, last hidden layer, a mask over the valid tokens),
a causal 3D VAE whose one-frame latents are normalised by the config's latents_mean/std, and
a transformer that sees the latents packed 2x2, the timestep as sigma and the text mask.

Qwen-Image-Edit (edit.py) builds on this class: text encoding goes through ``_text_pipeline``
and the network's image input through ``pack_latents``/``image_shapes``, so a subclass extends
those."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

from simpletuner.models.base import PLANNED_CAPTION

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.model_index import pipeline_class_name
from simpletuner.models.training_batch import TrainingBatch

NO_NEGATIVE_PROMPT = " "  # what Qwen-Image's own examples pass for "no negative prompt"
# model_flavour -> the pipeline class of the folders it trains: SimpleTuner's edit flavours
# (trained on edit pairs) and Qwen-Image 2.1.
FLAVOUR_PIPELINES = {"edit-v1": "QwenImageEditPipeline", "edit-v2": "QwenImageEditPlusPipeline",
                     "v2.1": "QwenImage21Pipeline"}
FLAVOUR_BUILTINS = {"edit-v1": "builtin:tiny-qwen_image-edit",
                    "edit-v2": "builtin:tiny-qwen_image-edit-plus",
                    "v2.1": "builtin:tiny-qwen_image-v2.1"}


class QwenImageAdapter(FlowFamilyAdapter):
    family = "qwen_image"
    text_encoder_specs = (("text_encoder", "tokenizer", Qwen2_5_VLForConditionalGeneration,
                           Qwen2Tokenizer),)
    transformer_class = QwenImageTransformer2DModel
    pipeline_class = QwenImagePipeline
    vae_class = AutoencoderKLQwenImage
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    # SimpleTuner's default LoRA targets for Qwen-Image: the joint attention's image-stream
    # projections (QKV and output).
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")
    # The last block's text-stream output (to_add_out, txt_mlp...) feeds nothing: the network
    # returns the image stream only.
    ddp_find_unused_parameters = True

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        """The flavours that change what is trained (edit pairs, Qwen-Image 2.1) are checked
        against the folder's pipeline class; a folder of one of them needs its flavour."""
        found, wanted = pipeline_class_name(folder), FLAVOUR_PIPELINES.get(flavour)
        if found == wanted or (wanted is None and found not in FLAVOUR_PIPELINES.values()):
            return None
        if wanted is not None:
            return (f"{flavour!r} trains a {wanted} model, but the model_index.json of {folder} "
                    f"names {found}; use such a folder (or {FLAVOUR_BUILTINS[flavour]}), or "
                    "remove model_flavour")
        needed = next(name for name, pipeline in FLAVOUR_PIPELINES.items() if pipeline == found)
        datasets = " (and give its datasets conditioning_data)" if needed.startswith("edit") else ""
        return f"{folder} is a {found} model; set model_flavour {needed!r}{datasets}"

    @classmethod
    def check_folder(cls, folder: Path) -> None:
        """Against the layout of the folder's own flavour (2.1 has processor/, no tokenizer/)."""
        super(QwenImageAdapter, cls.for_folder(folder)).check_folder(folder)

    @classmethod
    def load(cls, folder: Path, **settings) -> "QwenImageAdapter":
        return super(QwenImageAdapter, cls.for_folder(folder)).load(folder, **settings)

    @property
    def vae_factor(self) -> int:
        return 2 ** len(self.vae.temperal_downsample)  # as QwenImagePipeline computes it

    @property
    def latent_patch(self) -> int:
        return 2  # the pipeline's 2x2 packing

    def _latent_statistics(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """latents_mean and latents_std shaped [1, C, 1, 1, 1] like ``like``."""
        config = self.vae.config
        shape = (1, config.z_dim, 1, 1, 1)
        mean = torch.tensor(config.latents_mean).view(shape)
        std = torch.tensor(config.latents_std).view(shape)
        return mean.to(like.device, like.dtype), std.to(like.device, like.dtype)

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, 16, H/8, W/8]: the VAE's one-frame mode, (z - mean) / std, as
        the Qwen-Image pipelines normalise what they encode and undo before decoding."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype).unsqueeze(2)  # one frame
        latents = self.vae.encode(pixels).latent_dist.mode()
        mean, std = self._latent_statistics(latents)
        return ((latents - mean) / std)[:, :, 0]

    def _text_pipeline(self) -> QwenImagePipeline:
        """The pipeline class around the loaded text encoder alone, to call its encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T, width], "prompt_embeds_mask": [B, T]}: the pipeline's
        encode_prompt, T the longest prompt's valid tokens, shorter ones zero-padded with a
        zero mask (the pipeline returns no mask when nothing is padded: here, all ones)."""
        embeds, mask = self._text_pipeline().encode_prompt(prompts, device=self.device)
        if mask is None:
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """The pipeline splits its embeddings by each prompt's valid tokens, which the meta
        device cannot count: those of its template around the caption, less the template's
        start it drops, as the folder's tokenizer counts them."""
        pipeline = self._text_pipeline()
        text = pipeline.prompt_template_encode.format(PLANNED_CAPTION)
        tokens = (len(self.tokenizers[0](text).input_ids)
                  - pipeline.prompt_template_encode_start_idx)
        width = self.text_encoders[0].config.text_config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_embeds_mask": torch.ones(count, tokens, dtype=torch.long,
                                                 device=self.device)}

    @staticmethod
    def pack_latents(latents: torch.Tensor) -> torch.Tensor:
        """[B, C, h, w] -> [B, (h/2)(w/2), 4C] with the pipeline's own _pack_latents."""
        count, channels, height, width = latents.shape
        return QwenImagePipeline._pack_latents(latents, count, channels, height, width)

    def unpack_latents(self, tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """The inverse of pack_latents for an h x w latent (the pipeline's _unpack_latents,
        which takes pixel sizes and returns one frame)."""
        factor = self.vae_factor
        return QwenImagePipeline._unpack_latents(tokens, height * factor, width * factor,
                                                 factor)[:, :, 0]

    @staticmethod
    def image_shapes(count: int, height: int, width: int) -> list[list[tuple[int, int, int]]]:
        """img_shapes as the pipeline passes them: per sample, (frames, rows, columns) of the
        packed tokens of each image in the sequence."""
        return [[(1, height // 2, width // 2)]] * count

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        count, _, height, width = noisy.shape
        embeds = batch.prompt_embeds
        tokens = network(
            hidden_states=self.pack_latents(noisy), timestep=sigmas.to(dtype),
            encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
            encoder_hidden_states_mask=embeds["prompt_embeds_mask"].to(torch.long),
            img_shapes=self.image_shapes(count, height, width), return_dict=False)[0]
        return self.unpack_latents(tokens, height, width)

    def validation_arguments(self, arguments: dict) -> dict:
        """Qwen-Image's classifier-free guidance is true_cfg_scale, applied only with a negative
        prompt; guidance_scale is for guidance-distilled models, which Qwen-Image is not."""
        arguments = dict(arguments)
        scale = arguments.pop("guidance_scale")
        if scale > 1.0:
            arguments.setdefault("negative_prompt", NO_NEGATIVE_PROMPT)
        return {**arguments, "true_cfg_scale": scale, "guidance_scale": None}
