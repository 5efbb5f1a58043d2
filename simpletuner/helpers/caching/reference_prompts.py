"""Text embeddings of a family whose text encoder reads each caption with the sample's reference
images (Qwen-Image-Edit): one entry per caption and references a sample can train with, keyed
by the caption and the names of its references' latent entries (content digests), so a changed
reference, or one fitted otherwise, is read again. The encoder sees each reference as its latent
was made from it: the same file, resize and crop."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from PIL import Image
from tqdm.auto import tqdm

from simpletuner.helpers.caching.latents import LatentCache, fitted_image
from simpletuner.helpers.caching.references import CachedReferences
from simpletuner.helpers.caching.storage import save_entry
from simpletuner.helpers.caching.text_embeds import TextEmbedCache
from simpletuner.helpers.metadata.buckets import parse_bucket_key
from simpletuner.helpers.multiaspect.image import to_image

# ModelAdapter.encode_prompts of such a family: prompts and, per prompt, its reference images.
EncodeWithReferences = Callable[[list[str], list[list[Image.Image]]], dict[str, torch.Tensor]]
# (caption, its sample's reference id in each conditioning dataset)
PromptItem = tuple[str, tuple[str, ...]]


def reference_keys(latents: Mapping[str, LatentCache], conditioning_ids: Sequence[str],
                   reference_ids: Sequence[str]) -> tuple[str, ...]:
    """The latent entry names of a sample's references: what its text entry is keyed by."""
    return tuple(latents[c].paths[r].stem
                 for c, r in zip(conditioning_ids, reference_ids, strict=True))


class ReferenceImages:
    """A sample's reference images as their latents were made from them."""

    def __init__(self, references: CachedReferences, conditioning_ids: Sequence[str]):
        self.conditioning_ids = tuple(conditioning_ids)
        self.latents = references.caches
        self.plans = references.plans
        self.sizes = {c: {r: parse_bucket_key(bucket) for bucket, ids in index.buckets.items()
                          for r in ids} for c, (_, index) in self.plans.items()}

    def images(self, reference_ids: Sequence[str]) -> list[Image.Image]:
        images = []
        for conditioning_id, reference_id in zip(self.conditioning_ids, reference_ids,
                                                 strict=True):
            settings, _ = self.plans[conditioning_id]
            fitted = fitted_image(settings, reference_id,
                                  self.sizes[conditioning_id][reference_id])
            if isinstance(fitted, str):  # its latent was cached, so the file changed since
                raise OSError(f"reference {conditioning_id}/{reference_id}: {fitted}; rerun "
                              "to cache it again")
            images.append(to_image(fitted.pixels))
        return images


def cache_prompts_with_references(items: Sequence[PromptItem], references: ReferenceImages,
                                  cache: TextEmbedCache, encode: EncodeWithReferences, *,
                                  batch_size: int = 8, progress: bool = True) -> int:
    """Encode the ``items`` (this rank's share) whose entry is missing; returns how many."""
    keyed = {(caption, reference_keys(references.latents, references.conditioning_ids, ids)):
             ids for caption, ids in items}
    todo = [key for key in sorted(keyed) if not cache.path_for(*key).exists()]
    with tqdm(total=len(todo), desc=f"caching text embeddings [{cache.folder.name}]",
              unit="caption", disable=not progress or not todo) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            images = [references.images(keyed[key]) for key in batch]
            with torch.no_grad():
                embeds = encode([caption for caption, _ in batch], images)
            embeds = {name: t.detach().to("cpu", torch.float32) for name, t in embeds.items()}
            for row, key in enumerate(batch):
                save_entry(cache.path_for(*key), {name: t[row] for name, t in embeds.items()})
            bar.update(len(batch))
    return len(todo)
