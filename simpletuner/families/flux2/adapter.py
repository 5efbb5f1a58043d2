"""FLUX.2: one transformer (Flux2Transformer2DModel) and VAE (AutoencoderKLFlux2) in two layouts
that the folder's model_index.json tells apart. dev (Flux2Pipeline): a Mistral3 text encoder
behind a PixtralProcessor, guidance-distilled. klein (Flux2KleinPipeline): a Qwen3 text
encoder, no guidance input. Latents are the VAE's mode patchified 2x2 (128 channels) and
normalised by the VAE's batch-norm running statistics; the transformer sees one token per
patchified latent pixel with (0, row, column, 0) ids, the stacked hidden states of the
pipeline's encoder layers with (0, 0, 0, position) ids, and the timestep as sigma. Everything
the pipelines do for this is reused from their static helpers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from diffusers import (AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Pipeline,
                       Flux2Transformer2DModel)
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
from transformers import (AutoProcessor, Mistral3ForConditionalGeneration, Qwen2Tokenizer,
                          Qwen3ForCausalLM)

from simpletuner.models.layout import ModelFolderError

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.model_index import pipeline_class_name
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device

KLEIN_PIPELINE = "Flux2KleinPipeline"
MAX_SEQUENCE_LENGTH = 512  # both pipelines' default max_sequence_length
FLAVOUR_PIPELINES = {"dev": "Flux2Pipeline", "klein-4b": KLEIN_PIPELINE,
                     "klein-9b": KLEIN_PIPELINE}  # SimpleTuner's model_flavour names


class Flux2Adapter(FlowFamilyAdapter):
    """FLUX.2-dev's layout; the spec picks Flux2KleinAdapter for a klein folder."""

    family = "flux2"
    text_encoder_specs = (("text_encoder", "tokenizer", Mistral3ForConditionalGeneration,
                           AutoProcessor),)
    transformer_class = Flux2Transformer2DModel
    vae_class = AutoencoderKLFlux2
    pipeline_class = Flux2Pipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, FLUX.1, SD3
    # SimpleTuner's default FLUX.2 targets: image-stream attention, single blocks' fused input.
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0", "to_qkv_mlp_proj")
    text_layers = (10, 20, 30)  # encoder hidden states the pipeline stacks

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        if flavour is None:
            return None
        if flavour not in FLAVOUR_PIPELINES:
            return (f"{flavour!r} is not a FLUX.2 flavour; use one of "
                    f"{', '.join(FLAVOUR_PIPELINES)}, or remove it (the folder decides)")
        expected, found = FLAVOUR_PIPELINES[flavour], pipeline_class_name(folder)
        if found == expected:
            return None
        return (f"{flavour!r} is a {expected} model, but the model_index.json of {folder} "
                f"names {found}; set model_flavour to match the folder, or remove it")

    @classmethod
    def load(cls, folder: Path, **settings) -> "Flux2Adapter":
        layout = cls.for_folder(folder)
        if layout is Flux2Adapter and importlib.util.find_spec("torchvision") is None:
            raise ModelFolderError(
                f"{folder} is a FLUX.2-dev folder: its tokenizer is a PixtralProcessor, which "
                "transformers imports only with torchvision; install the torchvision build "
                "that matches your torch (klein folders do not need it)")
        return super(Flux2Adapter, layout).load(folder, **settings)

    @property
    def vae_factor(self) -> int:
        """The VAE's 8x and the 2x2 patchify: one latent pixel per 16x16 image pixels."""
        return 2 ** len(self.vae.config.block_out_channels)

    @property
    def latent_patch(self) -> int:
        return 1  # latents are patchified already; the transformer's patch_size is 1

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """As the pipelines' _encode_vae_image: the mode, patchified, batch-norm normalised."""
        pixels = pixels.to(self.device, dtype=self.vae.dtype)
        latents = self.pipeline_class._patchify_latents(self.vae.encode(pixels).latent_dist.mode())
        mean, std = self._latent_statistics(latents)
        return (latents - mean) / std

    def _latent_statistics(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps)
        return mean, std.to(latents.device, latents.dtype)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 512, layers * encoder width]}, as the pipeline's encode_prompt."""
        return {"prompt_embeds": self._prompt_embeds(prompts)}

    def _prompt_embeds(self, prompts: list[str]) -> torch.Tensor:
        return self.pipeline_class._get_mistral_3_small_prompt_embeds(
            self.text_encoders[0], self.tokenizers[0], prompts, device=self.device,
            max_sequence_length=MAX_SEQUENCE_LENGTH, system_message=SYSTEM_MESSAGE,
            hidden_states_layers=self.text_layers)

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        pipeline = self.pipeline_class
        prompt_embeds = batch.prompt_embeds["prompt_embeds"].to(dtype)
        latent_ids = to_device(pipeline._prepare_latent_ids(noisy), self.device)
        guidance = None  # the pipelines pass one only to guidance-distilled transformers
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((noisy.shape[0],), self.loss_settings.flux_guidance_value,
                                  device=self.device, dtype=torch.float32)
        hidden_states, img_ids = self._with_references(pipeline._pack_latents(noisy),
                                                       latent_ids, batch, dtype)
        tokens = network(
            hidden_states=hidden_states, timestep=sigmas.to(dtype),
            guidance=guidance, encoder_hidden_states=prompt_embeds,
            txt_ids=to_device(pipeline._prepare_text_ids(prompt_embeds), self.device),
            img_ids=img_ids, return_dict=False)[0]
        # the noisy image's tokens first, references' after (context only); klein's unpacking
        # takes the size, so no device sync for it per step
        return Flux2KleinPipeline._unpack_latents_with_ids(
            tokens[:, :latent_ids.shape[1]], latent_ids, *noisy.shape[-2:])

    def _with_references(self, hidden_states: torch.Tensor, ids: torch.Tensor,
                         batch: TrainingBatch, dtype: torch.dtype
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """Edit pairs (conditioning_data): each reference's packed latents after the noisy
        image's tokens, in conditioning_data order, with the pipeline's ids (time 10, 20...)."""
        if not batch.reference_latents:
            return hidden_states, ids
        pipeline, count = self.pipeline_class, hidden_states.shape[0]
        references = [r.to(dtype) for r in batch.reference_latents]
        reference_ids = pipeline._prepare_image_ids([r[:1] for r in references])
        reference_ids = to_device(reference_ids, self.device).expand(count, -1, -1)
        return (torch.cat([hidden_states, *map(pipeline._pack_latents, references)], dim=1),
                torch.cat([ids, reference_ids.to(ids.dtype)], dim=1))


class Flux2KleinAdapter(Flux2Adapter):
    """FLUX.2-klein (4B, 9B): Qwen3 hidden states of the chat-templated prompt."""

    text_encoder_specs = (("text_encoder", "tokenizer", Qwen3ForCausalLM, Qwen2Tokenizer),)
    pipeline_class = Flux2KleinPipeline
    text_layers = (9, 18, 27)

    def _prompt_embeds(self, prompts: list[str]) -> torch.Tensor:
        return self.pipeline_class._get_qwen3_prompt_embeds(
            self.text_encoders[0], self.tokenizers[0], prompts, device=self.device,
            max_sequence_length=MAX_SEQUENCE_LENGTH, hidden_states_layers=self.text_layers)

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        pipeline = super().build_pipeline(trainable)
        # Step-distilled klein models say so in model_index.json; the pipeline then skips CFG.
        index = json.loads((self.folder / "model_index.json").read_text(encoding="utf-8"))
        pipeline.register_to_config(is_distilled=bool(index.get("is_distilled", False)))
        return pipeline
