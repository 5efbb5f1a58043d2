"""HiDream-I1: the prompts read through HiDreamImagePipeline's own encode_prompt (T5's last
states, every Llama layer's states, the two CLIP projections concatenated as the pooled
embedding), the Flux-like VAE (shifted and scaled), and a transformer with mixture-of-experts
feed-forwards that patchifies the latents itself, takes the timestep as 1000 * sigma and
predicts latents - noise: the pipeline negates its output before the scheduler step."""

from __future__ import annotations

import torch
from diffusers import HiDreamImagePipeline, HiDreamImageTransformer2DModel
from transformers import (CLIPTextModelWithProjection, CLIPTokenizer, LlamaForCausalLM,
                          PreTrainedTokenizerFast, T5EncoderModel, T5Tokenizer)

from simpletuner.models.flow_family import FLOW_TIMESTEPS, FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


def image_from_tokens(output: torch.Tensor, height: int, width: int, patch: int
                      ) -> torch.Tensor:
    """The transformer's training-mode output [B, C, tokens, patch * patch] (tokens row by
    row, a non-square grid's padded to max_seq) as latents [B, C, height, width]."""
    count, channels = output.shape[:2]
    rows, columns = height // patch, width // patch
    grid = output[:, :, :rows * columns].reshape(count, channels, rows, columns, patch, patch)
    return grid.permute(0, 1, 2, 4, 3, 5).reshape(count, channels, height, width)


class HiDreamAdapter(FlowFamilyAdapter):
    family = "hidream"
    text_encoder_specs = (
        ("text_encoder", "tokenizer", CLIPTextModelWithProjection, CLIPTokenizer),
        ("text_encoder_2", "tokenizer_2", CLIPTextModelWithProjection, CLIPTokenizer),
        ("text_encoder_3", "tokenizer_3", T5EncoderModel, T5Tokenizer),
        ("text_encoder_4", "tokenizer_4", LlamaForCausalLM, PreTrainedTokenizerFast))
    transformer_class = HiDreamImageTransformer2DModel
    pipeline_class = HiDreamImagePipeline
    forbidden_subfolders = ("unet",)
    # The attention projections of every block, the image stream's and the text stream's
    # (_t); HiDream's output projection is a Linear, not diffusers' usual to_out.0.
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out",
                           "to_q_t", "to_k_t", "to_v_t", "to_out_t")
    # The experts a step routes no token to get no gradient.
    ddp_find_unused_parameters = True

    @classmethod
    def swappable_blocks(cls, network: torch.nn.Module) -> list[torch.nn.Module]:
        """The double-stream blocks, then the single-stream ones (not the caption
        projections, the transformer's other ModuleList)."""
        return [*network.double_stream_blocks, *network.single_stream_blocks]

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        """The pipeline makes every image at the area of its default_sample_size (128 latent
        pixels a side, whatever size is asked for), which is the transformer's max_resolution
        in HiDream's folders; the pipeline takes it from there, so the area fits the
        transformer loaded."""
        pipeline = super().build_pipeline(trainable)
        pipeline.default_sample_size = self.transformer.config.max_resolution[0]
        return pipeline

    def _text_pipeline(self) -> HiDreamImagePipeline:
        """The pipeline class around the loaded text encoders alone, to call encode_prompt."""
        return self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                   **self._pipeline_text_components())

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"t5_embeds": [B, tokens, width], "llama_embeds": [B, layers, tokens, width],
        "pooled_embeds": [B, 2 projections]}: the pipeline's encode_prompt without the
        negative pass (its Llama states come layer first: stored batch first)."""
        t5, _, llama, _, pooled, _ = self._text_pipeline().encode_prompt(
            prompts, device=self.device, do_classifier_free_guidance=False)
        return {"t5_embeds": t5, "llama_embeds": llama.transpose(0, 1).contiguous(),
                "pooled_embeds": pooled}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        output = network(
            hidden_states=noisy, timesteps=(sigmas * FLOW_TIMESTEPS).to(dtype),
            encoder_hidden_states_t5=embeds["t5_embeds"].to(dtype),
            encoder_hidden_states_llama3=embeds["llama_embeds"].transpose(0, 1).to(dtype),
            pooled_embeds=embeds["pooled_embeds"].to(dtype), return_dict=False)[0]
        if self.transformer.training:  # its training-mode output is patches, not latents
            output = image_from_tokens(output, *noisy.shape[-2:], self.latent_patch)
        return -output
