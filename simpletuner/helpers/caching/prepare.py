"""Start-up step between discovery and the split: fill both caches for every dataset, drop the
images that were read but could not be decoded from the index on every rank alike, and return
what the training loop reads batches from. A read that fails (storage unreachable past its
retries) is an error, raised on every rank by the latents' failing_together block. The only
collectives of caching are here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from simpletuner.helpers.caching.failures import describe_failures, gather_failures
from simpletuner.helpers.caching.latents import EncodeImages, LatentSettings, cache_latents
from simpletuner.helpers.caching.reference_prompts import (ReferenceImages,
                                                           cache_prompts_with_references)
from simpletuner.helpers.caching.references import CachedReferences, cache_references
from simpletuner.helpers.caching.storage import model_identity, rank_share
from simpletuner.helpers.caching.text_embeds import (
    EncodePrompts, TextEmbedCache, cache_text_embeds, default_text_dir,
)
from simpletuner.helpers.metadata.backends.captions import CaptionError
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.captions import EMPTY_CAPTION, CaptionPolicy
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest
from simpletuner.helpers.multiaspect.dataset import BatchAssembler
from simpletuner.common.together import failing_together

logger = logging.getLogger(__name__)


@dataclass
class PreparedCaches:
    indexes: dict[str, DatasetIndex]          # without failed samples; identical on every rank
    failures: dict[str, dict[str, str]]       # dataset id -> sample id -> reason
    assembler: BatchAssembler
    # conditioning dataset id -> reference id -> why its latent could not be cached
    reference_failures: dict[str, dict[str, str]] = field(default_factory=dict)

    def reported(self, references: Mapping[str, DatasetIndex]) -> dict[str, DatasetIndex]:
        """Every index whose skipped files the report names: the trained datasets' and the
        conditioning datasets' (``references``, start-up's), less what failed to cache."""
        return {**self.indexes, **{c: index.without(self.reference_failures.get(c, {}))
                                   for c, index in references.items()}}


def latent_components(model_folder: str | Path) -> list[str]:
    """Sub-folders that shape latent entries: the VAE, an image encoder with its processor
    where the family caches image embeddings with the latents (Wan I2V), and an audio VAE where
    it caches clips' sound (LTX-2)."""
    return ["vae"] + [name for name in ("image_encoder", "image_processor", "audio_vae")
                      if (Path(model_folder) / name).is_dir()]


def text_components(model_folder: str | Path) -> list[str]:
    """Sub-folders that shape text embeddings (text_encoder*, tokenizer*), for any family, and
    the text connectors whose output LTX-2 caches."""
    return sorted(p.name for p in Path(model_folder).iterdir()
                  if p.is_dir() and (p.name.startswith(("text_encoder", "tokenizer"))
                                     or p.name == "connectors"))


def read_captions(caption_for: Callable[[str], str], sample_ids: Sequence[str],
                  limit: int = 5) -> list[str]:
    """The captions of ``sample_ids``. Every unreadable caption file is named in one
    CaptionError, so a single fix-up round (and rerun) mends them all."""
    captions, problems = [], []
    for sample_id in sample_ids:
        try:
            captions.append(caption_for(sample_id))
        except CaptionError as exc:
            problems.append(str(exc))
    if problems:
        more = f"; ... and {len(problems) - limit} more" if len(problems) > limit else ""
        raise CaptionError(f"{len(problems)} caption file(s) cannot be used: "
                           + "; ".join(problems[:limit]) + more)
    return captions


def prepare_caches(datasets: Sequence, indexes: Mapping[str, DatasetIndex],
                   caption_for: Mapping[str, Callable[[str], str]],
                   encode_images: EncodeImages, encode_prompts: EncodePrompts, *,
                   model_folder: str | Path, family: str, output_dir: str | Path, seed: int,
                   rank: int, world_size: int, vae_batch_size: int = 8,
                   progress: bool = True,
                   conditioning: Mapping[str, tuple] | None = None,
                   prompts_see_references: bool = False,
                   audio: AudioRequest | None = None,
                   encode_control: EncodeImages | None = None) -> PreparedCaches:
    """Call on every rank, after the Accelerator is built and every rank holds the same
    ``indexes``. ``datasets`` are configuration.DatasetConfig in config order; ``caption_for``
    maps dataset id -> MetadataBackend.caption_for; ``seed`` is the resolved shared seed;
    ``conditioning``: id -> (conditioning DatasetConfig, its paired index), for edit pairs,
    whose references are cached first; ``audio``: the model's audio input (clip datasets' entries
    hold each clip's sound); ``prompts_see_references``: the text encoder reads
    each caption with its sample's references (``encode_prompts(captions, images)``);
    ``encode_control``: a ControlNet adapter's, for its control images.
    Each rank's work between two collectives is one ``failing_together`` block: an error on
    any rank (a model that cannot encode, an unreadable caption, a full disk) is a RankFailure
    on every rank, never a rank waiting alone in the next collective."""
    with failing_together("reading the model's identity for the caches"):
        vae_identity = model_identity(model_folder, latent_components(model_folder), family)
        text_identity = model_identity(model_folder, text_components(model_folder), family)
    latent_caches, text_caches, kept, failures, reference_failures = {}, {}, {}, {}, {}
    masks, controls = (named_alone(datasets, conditioning or {}, kind)
                       for kind in ("is_mask", "is_control"))
    alone = masks | controls  # pixel conditioning: neither references nor read with prompts
    for dataset in datasets:
        settings = LatentSettings.for_dataset(dataset, output_dir=output_dir,
                                              model_identity=vae_identity, seed=seed,
                                              audio=audio)
        index, references = indexes[dataset.id], None
        if dataset.conditioning_ids():
            references = cache_references(
                dataset, conditioning or {}, index, settings, encode_images,
                output_dir=output_dir, rank=rank, world_size=world_size,
                batch_size=vae_batch_size, progress=progress, encode_control=encode_control)
            index = references.target
            latent_caches.update(references.caches)
            reference_failures.update(references.failures)
            settings = masked_settings(settings, references, masks.get(dataset.id))
        result, merged = _cache_latents_together(
            dataset.id, index, settings, encode_images, rank=rank, world_size=world_size,
            batch_size=vae_batch_size, progress=progress)
        kept[dataset.id] = index.without(merged)
        failures[dataset.id] = merged
        latent_caches[dataset.id] = result.cache
        text_caches[dataset.id] = _cache_text(
            dataset, kept[dataset.id], caption_for[dataset.id], encode_prompts, text_identity,
            output_dir=output_dir, rank=rank, world_size=world_size, progress=progress,
            references=(ReferenceImages(references, dataset.conditioning_ids()) if references
                        and prompts_see_references and dataset.id not in alone else None))
    pairs = {d.id: d.conditioning_ids() for d in datasets
             if d.conditioning_ids() and d.id not in alone}
    assembler = BatchAssembler(latent_caches, text_caches, pairs, masks, controls,
                               prompts_see_references=prompts_see_references)
    return PreparedCaches(kept, failures, assembler, reference_failures)


def _cache_latents_together(dataset_id: str, index: DatasetIndex, settings, encode_images,
                            **work) -> tuple:
    """One dataset's latents cached by every rank, and the samples that failed on any rank:
    every rank gets every rank's failures (a collective), so all remove the same samples."""
    with failing_together(f"caching latents of dataset {dataset_id!r}"):
        result = cache_latents(index, settings, encode_images, **work)
    merged = gather_failures(result.failures)
    if merged and work["rank"] == 0:
        logger.warning(describe_failures(dataset_id, merged))
    return result, merged


def named_alone(datasets: Sequence, conditioning: Mapping[str, tuple],
                kind: str) -> dict[str, str]:
    """Dataset id -> the id of the conditioning dataset it names alone whose ``kind``
    ('is_mask': loss masks, 'is_control': control images) is true
    (configuration/conditioning_checks.py keeps these alone)."""
    return {d.id: d.conditioning_ids()[0] for d in datasets if d.conditioning_ids()
            and getattr(conditioning[d.conditioning_ids()[0]][0], kind)}


def masked_settings(settings: LatentSettings, references: CachedReferences,
                    mask_id: str | None) -> LatentSettings:
    """``settings`` with each sample's entry in the mask dataset ``mask_id``, so that its
    latents are made from its masked pixels; unchanged without a mask dataset."""
    if mask_id is None:
        return settings
    masks = references.caches[mask_id]
    return replace(settings, mask_of={s: masks.paths[refs[0]]
                                      for s, refs in references.target.references.items()})


def _cache_text(dataset, index: DatasetIndex, caption_for, encode_prompts: EncodePrompts,
                text_identity, *, output_dir, rank: int, world_size: int, progress: bool,
                references: ReferenceImages | None = None) -> TextEmbedCache:
    """The text embeddings of every caption ``index``'s samples can train with; with
    ``references``, of each such caption with its sample's references."""
    # Captions are read for this rank's samples only (caption files are per sample); a
    # caption shared by samples of several ranks may be encoded by each, harmlessly. Every
    # caption a sample can train with in any epoch is cached; the empty one by rank 0 only.
    # Leaving the block is a barrier: other ranks' text entries are complete after it.
    text = TextEmbedCache(default_text_dir(dataset, output_dir), text_identity)
    sample_ids = [s for ids in index.buckets.values() for s in ids]
    policy = CaptionPolicy.for_dataset(dataset)
    with failing_together(f"caching text embeddings of dataset {dataset.id!r}"):
        share = rank_share(sample_ids, rank, world_size)
        texts = read_captions(caption_for, share)
        if references is not None:  # every sample's captions, each with its references
            dropped = [EMPTY_CAPTION] if policy.may_drop else []
            items = [(caption, index.references[sample_id])
                     for sample_id, text_of_sample in zip(share, texts)
                     for caption in policy.candidates(text_of_sample) + dropped]
            cache_prompts_with_references(items, references, text, encode_prompts,
                                          progress=progress)
            return text
        captions = [c for text_of_sample in texts for c in policy.candidates(text_of_sample)]
        if policy.may_drop and rank == 0:
            captions.append(EMPTY_CAPTION)
        cache_text_embeds(captions, text, encode_prompts, progress=progress)
    return text
