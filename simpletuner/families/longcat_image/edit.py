"""LongCat-Image-Edit (model_family longcat_image, model_flavour edit): LongCat-Image trained on
edit pairs as LongCatImageEditPipeline gives its transformer each pair. The text encoder reads
the prompt after the reference image (resized as the pipeline resizes it), so the caption's
features start with the image's tokens and depend on the reference; the reference's latents are
packed like the noisy latents and appended to the image tokens with ids (2, T + row, T +
column), where T is the caption's length, as the noisy image's are (1, T + row, T + column);
the loss is on the noisy image's tokens only."""

from __future__ import annotations

import torch
from diffusers import LongCatImageEditPipeline
from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids
from diffusers.pipelines.longcat_image.pipeline_longcat_image_edit import calculate_dimensions
from PIL import Image

from simpletuner.families.flux.adapter import pack_latents, unpack_latents
from simpletuner.families.longcat_image.adapter import LongCatImageAdapter
from simpletuner.families.qwen_image.processor import load_processor
from simpletuner.models.caption_lengths import per_caption_length
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device

EDIT_AREA = 1024 * 1024  # the pipeline edits at about 1 MP, its text encoder reads half a side


class LongCatImageEditAdapter(LongCatImageAdapter):
    pipeline_class = LongCatImageEditPipeline
    prompts_see_references = True  # the text cache keys each caption by its reference too

    def validation_arguments(self, arguments: dict) -> dict:
        return arguments  # the edit pipeline never rewrites prompts

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str],
                       references: list[list[Image.Image]] | None = None
                       ) -> dict[str, torch.Tensor]:
        """{"prompt_embeds": [B, T, width], "prompt_embeds_mask": [B, T]}: the pipeline's
        encode_prompt of each prompt with its reference (one prompt per call, as the pipeline
        encodes), padded at the end to the longest."""
        if references is None or len(references) != len(prompts) or any(
                len(images) != 1 for images in references):
            raise ValueError("LongCatImageEditPipeline reads each prompt with one reference "
                             f"image: got {len(prompts)} prompts and "
                             f"{'no' if references is None else len(references)} references")
        pipeline = self.pipeline_class(scheduler=None, vae=None, transformer=None,
                                       **self._pipeline_text_components())
        rows = [pipeline.encode_prompt([prompt], image=self._prompt_image(pipeline, image))[0][0]
                for prompt, (image,) in zip(prompts, references)]
        longest = max(row.shape[0] for row in rows)
        embeds = torch.stack([torch.nn.functional.pad(row, (0, 0, 0, longest - row.shape[0]))
                              for row in rows]).to(self.device)
        mask = torch.stack([(torch.arange(longest) < row.shape[0]).long() for row in rows])
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask.to(self.device)}

    @staticmethod
    def _prompt_image(pipeline, image: Image.Image) -> Image.Image:
        width, height = calculate_dimensions(EDIT_AREA, image.width / image.height)
        resized = pipeline.image_processor.resize(image, height, width)
        return pipeline.image_processor.resize(resized, height // 2, width // 2)

    def planned_prompt_embeds(self, count: int) -> dict[str, torch.Tensor]:
        """The caption's 512 tokens after a 1 MP reference's image tokens (and their two
        markers), as the processor counts them at half the side."""
        # the memory plan's adapter is built without it
        processor = (self.text_processor or load_processor(self.folder, "text_processor"))
        processor = processor.image_processor
        side = int(EDIT_AREA ** 0.5) // 2
        grid = processor(images=Image.new("RGB", (side, side)), return_tensors="pt")
        tokens = int(grid["image_grid_thw"].prod()) // processor.merge_size ** 2 + 2 + 512
        planned = super().planned_prompt_embeds(count)["prompt_embeds"]
        return {"prompt_embeds": planned.new_empty(count, tokens, planned.shape[-1]),
                "prompt_embeds_mask": torch.ones(count, tokens, dtype=torch.long,
                                                 device=self.device)}

    def _predict(self, network, noisy: torch.Tensor, sigmas: torch.Tensor,
                 batch: TrainingBatch, dtype: torch.dtype) -> torch.Tensor:
        embeds = batch.prompt_embeds
        text = embeds["prompt_embeds"]

        def predict(rows: torch.Tensor, length: int) -> torch.Tensor:
            return self._edit(network, noisy[rows], sigmas[rows], text[rows, :length],
                              [reference[rows] for reference in batch.reference_latents], dtype)

        return per_caption_length(embeds["prompt_embeds_mask"], predict)

    def _edit(self, network, noisy: torch.Tensor, sigmas: torch.Tensor, text: torch.Tensor,
              references: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The network on samples whose captions all have text.shape[1] tokens."""
        _, _, height, width = noisy.shape
        length = text.shape[1]
        streams = [pack_latents(noisy)]
        ids = [prepare_pos_ids(modality_id=1, type="image", start=(length, length),
                               height=height // 2, width=width // 2)]
        for reference in references:
            streams.append(pack_latents(reference.to(noisy.dtype)))
            ids.append(prepare_pos_ids(modality_id=2, type="image", start=(length, length),
                                       height=reference.shape[-2] // 2,
                                       width=reference.shape[-1] // 2))
        text_ids = prepare_pos_ids(modality_id=0, type="text", num_token=length)
        tokens = network(hidden_states=torch.cat(streams, dim=1).to(dtype),
                         encoder_hidden_states=text.to(dtype),
                         timestep=sigmas.to(dtype),  # the pipeline's t / 1000
                         txt_ids=to_device(text_ids, self.device).to(dtype),
                         img_ids=to_device(torch.cat(ids), self.device).to(dtype),
                         return_dict=False)[0]
        # the noisy image's tokens come first; the reference's are context only
        return unpack_latents(tokens[:, :streams[0].shape[1]], height, width)
