"""Edit references' latents, cached like target latents (incrementally, each rank its static
share) before their targets': each reference is resized to its target's size and cut by the
target's crop (reference_strict), so the pair shares bucket and crop. A reference that cannot
be decoded takes its target out of training too, on every rank alike."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from simpletuner.common.together import failing_together
from simpletuner.helpers.caching.failures import describe_failures, gather_failures
from simpletuner.helpers.caching.latents import (EncodeImages, LatentCache, LatentSettings,
                                                 cache_latents)
from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.metadata.index import DatasetIndex

logger = logging.getLogger(__name__)


@dataclass
class CachedReferences:
    target: DatasetIndex                 # without the pairs whose reference failed
    caches: dict[str, LatentCache]       # conditioning dataset id -> its latents
    failures: dict[str, dict[str, str]]  # conditioning dataset id -> reference id -> reason


def reference_index(target: DatasetIndex, position: int, conditioning_id: str) -> DatasetIndex:
    """The ``position``-th references of ``target``'s samples, each in its target's bucket."""
    buckets = {key: [target.references[s][position] for s in ids]
               for key, ids in target.buckets.items()}
    sizes = {target.references[s][position]: target.original_sizes[s]
             for ids in target.buckets.values() for s in ids}
    return DatasetIndex(conditioning_id, buckets, sizes)


def reference_settings(target_settings: LatentSettings, conditioning, target: DatasetIndex,
                       position: int, *, output_dir: str | Path) -> LatentSettings:
    """The target's crop settings, the conditioning dataset's files and cache folder."""
    folder = conditioning.cache_dir_vae or Path(output_dir) / "cache" / "vae" / conditioning.id
    return replace(target_settings, storage=open_storage(conditioning), folder=Path(folder),
                   reference_of={refs[position]: (s, tuple(target.original_sizes[s]))
                                 for s, refs in target.references.items()})


def cache_references(dataset, conditioning: Mapping[str, object], target: DatasetIndex,
                     target_settings: LatentSettings, encode_images: EncodeImages, *,
                     output_dir: str | Path, rank: int, world_size: int, batch_size: int,
                     progress: bool) -> CachedReferences:
    """Every rank calls this for a dataset with conditioning_data (collectives inside)."""
    caches, failures, lost = {}, {}, {}
    for position, conditioning_id in enumerate(dataset.conditioning_ids()):
        settings = reference_settings(target_settings, conditioning[conditioning_id], target,
                                      position, output_dir=output_dir)
        with failing_together(f"caching reference latents of dataset {conditioning_id!r}"):
            result = cache_latents(reference_index(target, position, conditioning_id),
                                   settings, encode_images, rank=rank, world_size=world_size,
                                   batch_size=batch_size, progress=progress)
        merged = gather_failures(result.failures)  # collective: the same on every rank
        if merged and rank == 0:
            logger.warning(describe_failures(conditioning_id, merged))
        lost.update({settings.reference_of[ref][0]: f"edit pair: its reference "
                     f"{conditioning_id}/{ref} could not be cached ({reason})"
                     for ref, reason in merged.items()})
        caches[conditioning_id], failures[conditioning_id] = result.cache, merged
    return CachedReferences(target.without(lost), caches, failures)
