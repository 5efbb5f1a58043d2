"""Edit references' latents, cached like target latents (incrementally, each rank its static
share) before their targets': reference_strict resizes each reference to its target's size and
cuts it by the target's crop, so the pair shares bucket and crop; reference_loose fits it to
its own bucket with its own dataset's settings; a loss mask is fitted as reference_strict and
kept as weights (masks.py). A reference that cannot be decoded takes its target out of
training too, on every rank alike."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from simpletuner.common.together import failing_together
from simpletuner.helpers.caching.failures import describe_failures, gather_failures
from simpletuner.helpers.caching.latents import (EncodeImages, LatentCache, LatentSettings,
                                                 cache_latents)
from simpletuner.helpers.caching.generators import generated_then, generator, generator_identity
from simpletuner.helpers.caching.masks import MASK_IDENTITY, mask_weights
from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.metadata.index import DatasetIndex

logger = logging.getLogger(__name__)


@dataclass
class CachedReferences:
    target: DatasetIndex                 # without the pairs whose reference failed
    caches: dict[str, LatentCache]       # conditioning dataset id -> its latents
    failures: dict[str, dict[str, str]]  # conditioning dataset id -> reference id -> reason
    # conditioning dataset id -> what its references were fitted with and their buckets, so
    # a text encoder that reads references sees the images the latents were made from
    plans: dict[str, tuple[LatentSettings, DatasetIndex]] = field(default_factory=dict)


def reference_index(target: DatasetIndex, position: int, conditioning_id: str) -> DatasetIndex:
    """The ``position``-th references of ``target``'s samples, each in its target's bucket."""
    buckets = {key: [target.references[s][position] for s in ids]
               for key, ids in target.buckets.items()}
    sizes = {target.references[s][position]: target.original_sizes[s]
             for ids in target.buckets.values() for s in ids}
    return DatasetIndex(conditioning_id, buckets, sizes)


def loose_index(target: DatasetIndex, position: int, own: DatasetIndex) -> DatasetIndex:
    """reference_loose: the ``position``-th references of ``target``'s samples, each in its own
    bucket of ``own`` (its conditioning dataset's index)."""
    wanted = {refs[position] for refs in target.references.values()}
    return DatasetIndex(own.dataset_id, {key: [r for r in ids if r in wanted]
                                         for key, ids in own.buckets.items()},
                        {r: size for r, size in own.original_sizes.items() if r in wanted})


def reference_settings(target_settings: LatentSettings, conditioning, target: DatasetIndex,
                       position: int, *, output_dir: str | Path) -> LatentSettings:
    """reference_strict and mask: the target's crop settings, the conditioning dataset's files
    and cache folder; reference_loose: the conditioning dataset's own settings."""
    if conditioning.conditioning_type == "reference_loose":
        return LatentSettings.for_dataset(conditioning, output_dir=output_dir,
                                          model_identity=target_settings.model_identity,
                                          seed=target_settings.seed)
    folder = conditioning.cache_dir_vae or Path(output_dir) / "cache" / "vae" / conditioning.id
    strict = replace(target_settings, storage=open_storage(conditioning), folder=Path(folder),
                     reference_of={refs[position]: (s, tuple(target.original_sizes[s]))
                                   for s, refs in target.references.items()})
    if conditioning.is_mask:  # fitted as a strict reference, kept as weights: no model
        return replace(strict, model_identity=MASK_IDENTITY, first_frame_condition=False)
    if conditioning.is_control:  # kept as the family's ControlNet takes it
        made = (f"/{generator_identity(conditioning.conditioning)}"
                if conditioning.conditioning else "")  # generated from the target's file
        return replace(strict, model_identity=f"{strict.model_identity}/controlnet{made}",
                       first_frame_condition=False)
    return strict


def cache_references(dataset, conditioning: Mapping[str, tuple[object, DatasetIndex]],
                     target: DatasetIndex, target_settings: LatentSettings,
                     encode_images: EncodeImages, *, output_dir: str | Path, rank: int,
                     world_size: int, batch_size: int, progress: bool,
                     encode_control: EncodeImages | None = None) -> CachedReferences:
    """Every rank calls this for a dataset with conditioning_data (collectives inside);
    ``conditioning``: id -> (configuration.DatasetConfig, its paired index);
    ``encode_control``: how a ControlNet's control images are kept (the adapter's)."""
    caches, failures, lost, plans = {}, {}, {}, {}
    for position, conditioning_id in enumerate(dataset.conditioning_ids()):
        config, own = conditioning[conditioning_id]
        settings = reference_settings(target_settings, config, target, position,
                                      output_dir=output_dir)
        index = (loose_index(target, position, own) if settings.reference_of is None
                 else reference_index(target, position, conditioning_id))
        with failing_together(f"caching reference latents of dataset {conditioning_id!r}"):
            encode = (mask_weights if config.is_mask
                      else encode_control if config.is_control else encode_images)
            if config.conditioning:  # a conditioning block: generated from the fitted target
                encode = generated_then(generator(config.conditioning), encode)
            result = cache_latents(index, settings, encode, rank=rank,
                                   world_size=world_size, batch_size=batch_size,
                                   progress=progress)
        merged = gather_failures(result.failures)  # collective: the same on every rank
        if merged and rank == 0:
            logger.warning(describe_failures(conditioning_id, merged))
        owners = {refs[position]: s for s, refs in target.references.items()}
        lost.update({owners[ref]: f"edit pair: its reference "
                     f"{conditioning_id}/{ref} could not be cached ({reason})"
                     for ref, reason in merged.items()})
        caches[conditioning_id], failures[conditioning_id] = result.cache, merged
        plans[conditioning_id] = (settings, index)
    return CachedReferences(target.without(lost), caches, failures, plans)
