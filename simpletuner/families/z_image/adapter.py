"""Z-Image: one Qwen3 text encoder read at its second-to-last hidden states after Qwen3's chat
template, caption tokens of variable length (the attention mask selects them), and a
single-stream transformer that takes lists of per-sample tensors, the timestep as 1 - sigma,
and predicts latents - noise (ZImagePipeline negates its output before the scheduler step).

Captions are cached padded to the pipeline's 512 tokens with their mask, so a batch stacks;
each sample's own tokens are cut out again before the transformer, as the pipeline passes
them, so a prompt's prediction does not depend on the other prompts of its batch."""

from __future__ import annotations

import torch
from diffusers import ZImagePipeline, ZImageTransformer2DModel
from transformers import AutoTokenizer, Qwen3Model

from simpletuner.models.base import PLANNED_CAPTION

from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.training_batch import TrainingBatch


class ZImageAdapter(FlowFamilyAdapter):
    family = "z_image"
    text_encoder_specs = (("text_encoder", "tokenizer", Qwen3Model, AutoTokenizer),)
    transformer_class = ZImageTransformer2DModel
    pipeline_class = ZImagePipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux
    # SimpleTuner's default LoRA targets: the attention projections of every block.
    lora_target_modules = ("to_k", "to_q", "to_v", "to_out.0")
    max_sequence_length = 512  # ZImagePipeline's default

    @property
    def latent_patch(self) -> int:
        return 2  # the patch size ZImagePipeline calls the transformer with

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 512, width], "prompt_mask": [B, 512], 1 on the caption's
        tokens}: ZImagePipeline._encode_prompt's hidden states before it drops the padding."""
        tokenizer = self.tokenizers[0]
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                               tokenize=False, add_generation_prompt=True,
                                               enable_thinking=True) for prompt in prompts]
        tokens = tokenizer(texts, padding="max_length", max_length=self.max_sequence_length,
                           truncation=True, return_tensors="pt")
        mask = tokens.attention_mask.to(self.device).bool()
        hidden = self.text_encoders[0](input_ids=tokens.input_ids.to(self.device),
                                       attention_mask=mask,
                                       output_hidden_states=True).hidden_states[-2]
        return {"prompt_embeds": hidden, "prompt_mask": mask.to(hidden.dtype)}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """The caption's tokens only: _predict drops the padding by the mask, which the meta
        device cannot read."""
        tokenizer = self.tokenizers[0]
        text = tokenizer.apply_chat_template([{"role": "user", "content": PLANNED_CAPTION}],
                                             tokenize=False, add_generation_prompt=True,
                                             enable_thinking=True)
        tokens = min(len(tokenizer(text).input_ids), self.max_sequence_length)
        width = self.text_encoders[0].config.hidden_size
        return {"prompt_embeds": torch.empty(count, tokens, width, device=self.device),
                "prompt_mask": torch.ones(count, tokens, device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds, masks = batch.prompt_embeds["prompt_embeds"], batch.prompt_embeds["prompt_mask"]
        captions = [embed[mask > 0.5].to(dtype) for embed, mask in zip(embeds, masks)]
        frames = list(noisy.unsqueeze(2).unbind(dim=0))  # [C, 1 frame, h, w] each
        # The pipeline's timestep: (1000 - 1000 * sigma) / 1000, i.e. 0 is pure noise.
        outputs = network(frames, 1.0 - sigmas.float(), captions, return_dict=False)[0]
        return -torch.stack([out.float() for out in outputs], dim=0).squeeze(2)
