"""Qwen-Image-Edit (model_family qwen_image, model_flavour edit-v1; edit-v2 below): Qwen-Image
trained on edit pairs as QwenImageEditPipeline gives its transformer each pair. The Qwen2.5-VL
text encoder reads the prompt with the reference image (through the processor), so a prompt's
embeddings depend on its reference; the reference's latents are packed like the noisy latents
and appended to the image tokens, img_shapes lists both, and the loss is on the noisy image's
tokens only."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE
from PIL import Image

from simpletuner.families.qwen_image.adapter import QwenImageAdapter
from simpletuner.families.qwen_image.processor import PIPELINE_ENTRY, load_processor
from simpletuner.models.training_batch import TrainingBatch


class QwenImageEditAdapter(QwenImageAdapter):
    pipeline_class = QwenImageEditPipeline
    prompts_see_references = True  # the text cache keys each caption by its references too
    max_references = 1
    # QwenImageEditPipeline resizes the reference to about 1 MP before its text encoder
    # reads it (the processor then fits it to its own pixel bounds).
    prompt_image_area = 1024 * 1024

    def __init__(self, *, processor, **parts):
        super().__init__(**parts)
        self.processor = processor

    @classmethod
    def required_subfolders(cls) -> tuple[str, ...]:
        return super().required_subfolders() + ("processor",)

    @classmethod
    def load_conditioning_components(cls, folder: Path, *, device: torch.device,
                                     weight_dtype: torch.dtype) -> dict:
        return {"processor": load_processor(folder)}

    def build_pipeline(self, trainable: torch.nn.Module | None = None):
        pipeline = super().build_pipeline(trainable)
        pipeline.register_to_config(processor=PIPELINE_ENTRY)  # what its export's folder holds
        return pipeline

    def _pipeline_text_components(self) -> dict:
        return {**super()._pipeline_text_components(), "processor": self.processor}

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str],
                       references: list[list[Image.Image]] | None = None
                       ) -> dict[str, torch.Tensor]:
        """The pipeline's encode_prompt of each prompt with its sample's references, each
        first resized as the pipeline resizes what its text encoder reads; an edit prompt has
        no meaning without them."""
        counts = {len(images) for images in references or ()}
        if references is None or len(references) != len(prompts) or not counts <= set(
                range(1, self.max_references + 1)):
            raise ValueError(f"{self.pipeline_class.__name__} reads each prompt with its "
                             f"reference images (1 to {self.max_references}): got "
                             f"{len(prompts)} prompts and "
                             f"{'no' if references is None else len(references)} references")
        pipeline = self._text_pipeline()
        resized = [[self._prompt_image(pipeline, image) for image in images]
                   for images in references]
        embeds, mask = self._encode(pipeline, prompts, resized)
        if mask is None:
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask}

    def _prompt_image(self, pipeline, image: Image.Image) -> Image.Image:
        width, height = calculate_dimensions(self.prompt_image_area, image.width / image.height)[:2]
        return pipeline.image_processor.resize(image, height, width)

    def _encode(self, pipeline, prompts: list[str], references: list[list[Image.Image]]):
        """(embeddings, mask or None): one reference per prompt, encoded together."""
        return pipeline.encode_prompt(prompts, image=[image for (image,) in references],
                                      device=self.device)

    @staticmethod
    def edit_image_shapes(count: int, height: int, width: int,
                          references: tuple[torch.Tensor, ...]) -> list:
        """img_shapes as the pipeline passes them: the noisy image's packed grid, then each
        reference's."""
        shapes = [(1, height // 2, width // 2)] + [
            (1, reference.shape[-2] // 2, reference.shape[-1] // 2) for reference in references]
        return [shapes] * count

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        count, _, height, width = noisy.shape
        tokens = self.pack_latents(noisy)
        streams = [tokens] + [self.pack_latents(reference.to(tokens.dtype))
                              for reference in batch.reference_latents]
        embeds = batch.prompt_embeds
        predicted = network(
            hidden_states=torch.cat(streams, dim=1), timestep=sigmas.to(dtype),
            encoder_hidden_states=embeds["prompt_embeds"].to(dtype),
            encoder_hidden_states_mask=embeds["prompt_embeds_mask"].to(torch.long),
            img_shapes=self.edit_image_shapes(count, height, width, batch.reference_latents),
            return_dict=False)[0]
        # the noisy image's tokens come first; the references' are context only
        return self.unpack_latents(predicted[:, :tokens.shape[1]], height, width)


class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """model_flavour edit-v2 ("edit plus"): up to three references per sample, each read by the
    text encoder as "Picture N" and appended to the image tokens, as QwenImageEditPlusPipeline
    does."""

    pipeline_class = QwenImageEditPlusPipeline
    max_references = 3
    prompt_image_area = CONDITION_IMAGE_SIZE  # the Plus pipeline's text encoder input size

    def _encode(self, pipeline, prompts: list[str], references: list[list[Image.Image]]):
        """The Plus pipeline's encode_prompt gives every prompt of a call the same pictures,
        so each prompt is encoded alone and the batch padded as the pipeline pads one."""
        rows = []
        for prompt, images in zip(prompts, references, strict=True):
            embeds, _ = pipeline.encode_prompt([prompt], image=images, device=self.device)
            rows.append(embeds[0])
        longest = max(row.shape[0] for row in rows)
        embeds = torch.stack([torch.nn.functional.pad(row, (0, 0, 0, longest - row.shape[0]))
                              for row in rows])
        mask = torch.stack([(torch.arange(longest, device=embeds.device) < row.shape[0]).long()
                            for row in rows])
        return embeds, mask
