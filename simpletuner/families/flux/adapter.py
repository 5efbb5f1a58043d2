"""Flux: the transformer sees latents packed into 2x2 patches with (0, row, column) position
ids, T5 hidden states with zero position ids, CLIP's pooled embedding, the timestep as sigma,
and a guidance value when the model is guidance-distilled (config guidance_embeds)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5Tokenizer

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.model_index import pipeline_class_name
from simpletuner.models.token_routing import TokenLayout
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device


KONTEXT_PIPELINE, KONTEXT_FLAVOUR = "FluxKontextPipeline", "kontext"


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C]: one token per 2x2 latent patch, row-major."""
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of pack_latents for a [height, width] latent."""
    b, _, packed_channels = tokens.shape
    patches = tokens.view(b, height // 2, width // 2, packed_channels // 4, 2, 2)
    return patches.permute(0, 3, 1, 4, 2, 5).reshape(b, packed_channels // 4, height, width)


def image_tokens(tokens: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """The transformer's output for the noisy image, unpacked to its shape: its tokens come
    first; reference tokens (Kontext) are context only."""
    height, width = noisy.shape[-2:]
    return unpack_latents(tokens[:, :(height // 2) * (width // 2)], height, width)


def image_position_ids(rows: int, columns: int) -> torch.Tensor:
    """[rows * columns, 3] ids (0, row, column) of the packed tokens, in packing order."""
    ids = torch.zeros(rows, columns, 3)
    ids[..., 1] = torch.arange(rows)[:, None]
    ids[..., 2] = torch.arange(columns)[None, :]
    return ids.reshape(rows * columns, 3)


def route_joint_rope(rope: tuple, keep: torch.Tensor, count: int) -> tuple:
    """Flux's rotary embedding has the text rows, then ``count`` image rows: the text rows and
    the kept image rows."""
    return tuple(torch.cat([rows[:-count], rows[-count:][keep]]) for rows in rope)


class FluxAdapter(FlowFamilyAdapter):
    family = "flux"
    text_encoder_specs = (("text_encoder", "tokenizer", CLIPTextModel, CLIPTokenizer),
                          ("text_encoder_2", "tokenizer_2", T5EncoderModel, T5Tokenizer))
    transformer_class = FluxTransformer2DModel
    pipeline_class = FluxPipeline
    forbidden_subfolders = ("unet", "text_encoder_3")  # UNet families, SD3
    t5_max_length = 512
    # TREAD: the image tokens are the blocks' hidden_states, the second item of their output
    token_layout = TokenLayout("hidden_states", {"image_rotary_emb": route_joint_rope}, 1)

    @property
    def latent_patch(self) -> int:
        return 2  # the 2x2 packing (the transformer's own patch_size is 1)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T5 tokens, T5 width], "pooled_prompt_embeds": [B, CLIP width]}."""
        clip_ids = self._token_ids(self.tokenizers[0], prompts)
        pooled = self.text_encoders[0](clip_ids, output_hidden_states=False).pooler_output
        t5 = self.text_encoders[1](self._t5_ids(self.tokenizers[1], prompts))[0]
        return {"prompt_embeds": t5, "pooled_prompt_embeds": pooled}

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        """Only 'kontext' changes what is trained (edit pairs), so only it is checked."""
        found = pipeline_class_name(folder)
        if (flavour == KONTEXT_FLAVOUR) == (found == KONTEXT_PIPELINE):
            return None
        if flavour == KONTEXT_FLAVOUR:
            return (f"'kontext' trains a {KONTEXT_PIPELINE} model, but the model_index.json of "
                    f"{folder} names {found}; use a FLUX.1 Kontext folder (or "
                    "builtin:tiny-flux-kontext), or remove model_flavour")
        return (f"{folder} is a {KONTEXT_PIPELINE} model; set model_flavour 'kontext' (and "
                "give its datasets conditioning_data)")

    @classmethod
    def load(cls, folder: Path, **settings) -> "FluxAdapter":
        return super(FluxAdapter, cls.for_folder(folder)).load(folder, **settings)

    def _image_stream(self, noisy: torch.Tensor, batch: TrainingBatch,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The transformer's image tokens and their position ids (Kontext adds references)."""
        _, _, height, width = noisy.shape
        ids = to_device(image_position_ids(height // 2, width // 2), self.device).to(dtype)
        return pack_latents(noisy), ids

    def _transformer_inputs(self, noisy: torch.Tensor, sigmas: torch.Tensor,
                            batch: TrainingBatch, dtype: torch.dtype) -> dict:
        """The transformer call's keyword arguments (a Flux ControlNet takes the same)."""
        hidden_states, img_ids = self._image_stream(noisy, batch, dtype)
        embeds = batch.prompt_embeds
        prompt_embeds = embeds["prompt_embeds"].to(dtype)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((noisy.shape[0],), self.loss_settings.flux_guidance_value,
                                  device=self.device, dtype=torch.float32)
        return dict(
            hidden_states=hidden_states, timestep=sigmas.to(dtype), guidance=guidance,
            pooled_projections=embeds["pooled_prompt_embeds"].to(dtype),
            encoder_hidden_states=prompt_embeds,
            txt_ids=torch.zeros(prompt_embeds.shape[1], 3, device=self.device, dtype=dtype),
            img_ids=img_ids, return_dict=False)

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        tokens = network(**self._transformer_inputs(noisy, sigmas, batch, dtype))[0]
        return image_tokens(tokens, noisy)
