"""LongCat-Image (meituan-longcat/LongCat-Image): Qwen2.5-VL's last hidden states of the caption
between the pipeline's chat prefix and suffix, padded to 512 tokens (the transformer attends to
all of them), read through LongCatImagePipeline's own encode_prompt; Flux VAE latents shifted and
scaled and packed 2x2; text position ids (0, i, i) and image ids (1, 512 + row, 512 + column);
the timestep sigma (the transformer scales it by 1000) and target noise - latents. Validation
does not rewrite the prompt with the text encoder (the pipeline's enable_prompt_rewrite)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import LongCatImagePipeline, LongCatImageTransformer2DModel
from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids
from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

from simpletuner.families.flux.adapter import pack_latents, unpack_latents
from simpletuner.families.qwen_image.processor import PIPELINE_ENTRY, load_processor
from simpletuner.models.flow_family import FlowFamilyAdapter
from simpletuner.models.model_index import pipeline_class_name
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device

TEXT_TOKENS = 512  # the pipeline's tokenizer_max_length: every caption is padded to it
EDIT_PIPELINE, EDIT_FLAVOUR = "LongCatImageEditPipeline", "edit"


class LongCatImageAdapter(FlowFamilyAdapter):
    family = "longcat_image"
    text_encoder_specs = (("text_encoder", "tokenizer", Qwen2_5_VLForConditionalGeneration,
                           Qwen2Tokenizer),)
    transformer_class = LongCatImageTransformer2DModel
    pipeline_class = LongCatImagePipeline
    forbidden_subfolders = ("unet", "text_encoder_2")  # UNet families, SD3 and Flux

    def __init__(self, *, text_processor=None, **parts):
        """``text_processor``: the pipeline's Qwen2VLProcessor (its prompt rewriting reads it);
        None where only the loss runs (the memory plan's meta adapter)."""
        super().__init__(**parts)
        self.text_processor = text_processor

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + ("text_processor",)

    @classmethod
    def flavour_problem(cls, folder: Path, flavour: str | None) -> str | None:
        """Only 'edit' changes what is trained (edit pairs); 'final' and 'dev' are weights."""
        found = pipeline_class_name(folder)
        if (flavour == EDIT_FLAVOUR) == (found == EDIT_PIPELINE):
            return None
        if flavour == EDIT_FLAVOUR:
            return (f"'edit' trains a {EDIT_PIPELINE} model, but the model_index.json of "
                    f"{folder} names {found}; use a LongCat-Image-Edit folder (or "
                    "builtin:tiny-longcat_image-edit), or remove model_flavour")
        return (f"{folder} is a {EDIT_PIPELINE} model; set model_flavour 'edit' (and give its "
                "datasets conditioning_data)")

    @classmethod
    def load(cls, folder: Path, **settings) -> "LongCatImageAdapter":
        return super(LongCatImageAdapter, cls.for_folder(folder)).load(folder, **settings)

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        return {"text_processor": load_processor(folder, "text_processor")}

    @property
    def latent_patch(self) -> int:
        return 2  # the 2x2 packing (the transformer's own patch_size is 1)

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        pipeline = super().build_pipeline(trainable)
        pipeline.register_to_config(text_processor=PIPELINE_ENTRY)  # what its export holds
        return pipeline

    def _pipeline_text_components(self) -> dict:
        return {**super()._pipeline_text_components(), "text_processor": self.text_processor}

    def validation_arguments(self, arguments: dict) -> dict:
        """The prompt as written: the pipeline would first have its text encoder rewrite it."""
        return {**arguments, "enable_prompt_rewrite": False}

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, 512, width]}: the pipeline's encode_prompt."""
        pipeline = self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                       **self._pipeline_text_components())
        embeds, _ = pipeline.encode_prompt(prompts)
        return {"prompt_embeds": embeds.to(self.device)}

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        width = self.text_encoders[0].config.text_config.hidden_size
        return {"prompt_embeds": torch.empty(count, TEXT_TOKENS, width, device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        _, _, height, width = noisy.shape
        text = batch.prompt_embeds["prompt_embeds"].to(dtype)
        text_ids = prepare_pos_ids(modality_id=0, type="text", num_token=text.shape[1])
        image_ids = prepare_pos_ids(modality_id=1, type="image",
                                    start=(TEXT_TOKENS, TEXT_TOKENS),
                                    height=height // 2, width=width // 2)
        tokens = network(hidden_states=pack_latents(noisy), encoder_hidden_states=text,
                         timestep=sigmas.to(dtype),  # the pipeline's t / 1000
                         txt_ids=to_device(text_ids, self.device).to(dtype),
                         img_ids=to_device(image_ids, self.device).to(dtype),
                         return_dict=False)[0]
        return unpack_latents(tokens, height, width)
