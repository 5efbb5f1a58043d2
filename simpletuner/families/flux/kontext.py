"""FLUX.1 Kontext (model_flavour 'kontext'): Flux trained on edit pairs. As
FluxKontextPipeline does, each reference's latents are packed like the noisy latents and
appended to the image tokens with position ids (1, row, column); the loss is on the noisy
image's tokens only."""

from __future__ import annotations

import torch
from diffusers import FluxKontextPipeline

from simpletuner.families.flux.adapter import FluxAdapter, image_position_ids, pack_latents
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import to_device

REFERENCE_ID = 1.0  # the first position id of every reference token (the pipeline's image_ids)


class FluxKontextAdapter(FluxAdapter):
    pipeline_class = FluxKontextPipeline

    def size_arguments(self, size: int | tuple[int, int]) -> dict:
        width, height = (size, size) if isinstance(size, int) else size
        # else the pipeline samples at 1024 x 1024, and resizes the reference to its own size
        return {"max_area": width * height, "_auto_resize": False}

    def _image_stream(self, noisy: torch.Tensor, batch: TrainingBatch,
                      dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, ids = super()._image_stream(noisy, batch, dtype)
        streams, positions = [tokens], [ids]
        for reference in batch.reference_latents:
            rows, columns = (side // 2 for side in reference.shape[-2:])
            reference_ids = image_position_ids(rows, columns)
            reference_ids[:, 0] = REFERENCE_ID
            streams.append(pack_latents(reference.to(tokens.dtype)))
            positions.append(to_device(reference_ids, self.device).to(dtype))
        return torch.cat(streams, dim=1), torch.cat(positions, dim=0)
