"""Turn the sampler's micro-batch references into the tensors the model trains on, from the
latent and text-embedding caches. On the training hot path: reads small safetensors files only,
no decoding and no model calls."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from simpletuner.helpers.caching.latents import LatentCache
from simpletuner.helpers.caching.masks import latent_grid
from simpletuner.helpers.caching.reference_prompts import reference_keys
from simpletuner.helpers.caching.text_embeds import TextEmbedCache
from simpletuner.helpers.multiaspect.batch import MicroBatch
from simpletuner.models.training_batch import TrainingBatch


class BatchAssembler:
    """``assembler(micro_batch) -> TrainingBatch``; holds only paths, so it can also run in
    DataLoader worker processes."""

    def __init__(self, latents: Mapping[str, LatentCache],
                 text_embeds: Mapping[str, TextEmbedCache],
                 conditioning: Mapping[str, list[str]] | None = None,
                 masks: Mapping[str, str] | None = None,
                 controls: Mapping[str, str] | None = None, *,
                 prompts_see_references: bool = False):
        self.latents = dict(latents)          # dataset id -> its latent cache
        self.text_embeds = dict(text_embeds)  # dataset id -> its text-embedding cache
        # edit pairs: dataset id -> its conditioning datasets (their latents are in ``latents``)
        self.conditioning = dict(conditioning or {})
        # masked loss: dataset id -> its mask dataset (whose weights are in ``latents``)
        self.masks = dict(masks or {})
        # controlnet: dataset id -> its control-image dataset (entries in ``latents``)
        self.controls = dict(controls or {})
        # the text entries of edit pairs are keyed by caption and references (Qwen-Image-Edit)
        self.prompts_see_references = prompts_see_references

    def __call__(self, micro_batch: MicroBatch) -> TrainingBatch:
        dataset_id = micro_batch.dataset_id
        if dataset_id not in self.latents or dataset_id not in self.text_embeds:
            raise KeyError(f"no caches for dataset {dataset_id!r}; caches exist for "
                           f"{sorted(self.latents)}")
        cached = self.latents[dataset_id].load([s.sample_id for s in micro_batch.samples])
        conditioning_ids = self.conditioning.get(dataset_id, ())
        references = None
        if self.prompts_see_references and conditioning_ids:
            references = [reference_keys(self.latents, conditioning_ids, s.references)
                          for s in micro_batch.samples]
        prompts = self.text_embeds[dataset_id].load([s.caption for s in micro_batch.samples],
                                                    references)
        return TrainingBatch(
            latents=cached.latents,
            prompt_embeds=prompts,
            original_sizes=cached.original_sizes,
            crop_top_lefts=cached.crop_top_lefts,
            target_sizes=cached.target_sizes,
            reference_latents=tuple(
                self.latents[conditioning_id].load(
                    [s.references[position] for s in micro_batch.samples]).latents
                for position, conditioning_id in enumerate(conditioning_ids)),
            conditioning=cached.conditioning,
            loss_mask=(None if micro_batch.dataset_id not in self.masks else latent_grid(
                self._named_alone(self.masks, micro_batch), cached.latents)),
            control=(None if micro_batch.dataset_id not in self.controls
                     else self._named_alone(self.controls, micro_batch)),
        )

    def _named_alone(self, named: dict[str, str], micro_batch: MicroBatch) -> torch.Tensor:
        """The entries of the samples' one conditioning dataset (a mask's, a control image's)."""
        cache = self.latents[named[micro_batch.dataset_id]]
        return cache.load([s.references[0] for s in micro_batch.samples]).latents

