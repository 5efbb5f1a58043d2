"""VAE latent cache: one safetensors file per sample, named by a digest of everything that
changes its contents, so a warm start encodes nothing and a changed setting never reuses a
stale entry. A clip (a video dataset's sample) is decoded to its bucket's frames (clip.py) and
its entry is [C, F', h, w]; a clip that decodes to fewer frames is a failed sample. A family
that conditions on the sample itself (Wan I2V: its first frame's latents and CLIP embedding)
returns them beside the latent, and they are kept in the same entry. For a model that trains
sound (its ``audio_input``), each clip's audio over its trained frames' span is decoded too and
given to the model with the frames; the entry records that span in the source
(``audio_span``: start and duration in seconds). A clip without an audio stream trains
video-only or is skipped, as its dataset's ``video.missing_audio`` says.

Every rank plans the whole cache (file stats, no decoding), then encodes only its static share
(``rank_share`` of the sorted sample ids). Images that were read but fail to decode, and files
gone since they were listed, are returned as (sample id -> reason); merging them over ranks is
``failures.gather_failures``. A read that fails (storage unreachable past its retries, a disk
error) is raised: it says nothing about the image, and skipping it would silently shrink the
dataset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from simpletuner.common.names import printable
from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.caching.masks import masked_pixels
from simpletuner.helpers.caching.storage import (
    CACHE_FORMAT, digest, entry_path, load_entry, rank_share, save_entry,
)
from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.data_backend.storage import Storage
from simpletuner.helpers.metadata.buckets import parse_bucket_key
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.video_buckets import bucket_frames
from simpletuner.helpers.multiaspect.clip import PreparedClip, prepare_clip
from simpletuner.helpers.multiaspect.clip_audio import AudioRequest
from simpletuner.helpers.multiaspect.image import Downsample, PreparedImage, prepare_image

logger = logging.getLogger(__name__)

# ModelAdapter.encode_for_cache (with first_frame_condition=True for a video.is_i2v dataset,
# audio= each clip's [channels, samples] or None for a model that trains sound): the latents,
# or {"latent": ..., <conditioning name>: ...}, each tensor batch-first.
EncodeImages = Callable[[torch.Tensor], torch.Tensor | dict[str, torch.Tensor]]
# What an entry holds besides a family's conditioning (which the batches carry).
ENTRY_PARTS = ("latent", "geometry", "audio_span")


@dataclass(frozen=True)
class LatentSettings:
    """Everything besides the image file itself that decides a sample's latent."""

    dataset_id: str
    storage: Storage           # where the dataset's images live
    folder: Path               # where entries are written (always local: read every step)
    model_identity: str        # storage.model_identity of the VAE (and family)
    crop: bool = False
    crop_style: str = "center"
    seed: int = 0              # the resolved shared seed; only random crops depend on it
    downsample: Downsample | None = None   # applies to cropped images only
    first_frame_condition: bool = False    # video.is_i2v: the model's first-frame condition too
    # Edit references (reference_strict): reference id -> (its target's sample id, the target's
    # original (w, h)); each is resized to that size and cropped as its target, whose dataset
    # is ``dataset_id``.
    reference_of: Mapping[str, tuple[str, tuple[int, int]]] | None = None
    audio: AudioRequest | None = None  # a clip dataset for a model that trains sound
    skip_silent: bool = False          # video.missing_audio 'skip': a clip without audio
    # conditioning_type 'mask': sample id -> its cached mask entry (masks.py); the sample's
    # pixels are blended to grey where its mask is 0 before encoding.
    mask_of: Mapping[str, Path] | None = None

    def crop_id(self, sample_id: str) -> str:
        """The sample id a random crop is keyed by: an edit reference's is its target's."""
        return self.reference_of[sample_id][0] if self.reference_of else sample_id

    @classmethod
    def for_dataset(cls, dataset, *, output_dir: str | Path, model_identity: str,
                    seed: int, audio: AudioRequest | None = None) -> "LatentSettings":
        """From a configuration.DatasetConfig; the folder is ``cache_dir_vae`` if set, else
        ``<output_dir>/cache/vae/<dataset id>``. ``audio``: the model's audio input, which a
        clip dataset's entries then hold."""
        folder = dataset.cache_dir_vae or Path(output_dir) / "cache" / "vae" / dataset.id
        downsample = None
        if dataset.crop and None not in (dataset.maximum_image_size,
                                         dataset.target_downsample_size):
            downsample = Downsample(dataset.resolution_type, dataset.maximum_image_size,
                                    dataset.target_downsample_size)
        clips, video = kind_of(dataset).has_clips, dataset.video or {}
        return cls(dataset.id, open_storage(dataset), Path(folder), model_identity,
                   dataset.crop, dataset.crop_style, seed, downsample,
                   clips and bool(video.get("is_i2v")), audio=audio if clips else None,
                   skip_silent=video.get("missing_audio") == "skip")

    def key(self, sample_id: str, target: tuple[int, int], file_size: int,
            change_key: int | str, frames: int | None = None, fps: int | None = None) -> str:
        """``frames``: a clip's, which its bucket decides; None for an image. ``fps``: the rate
        a clip is re-timed to (None: its own)."""
        random_crop = self.crop and self.crop_style == "random"
        return digest({
            "format": CACHE_FORMAT, "kind": "latent", "model": self.model_identity,
            "file": [self.storage.identity(sample_id), file_size, change_key],
            "target": list(target), "crop": self.crop,
            "crop_style": self.crop_style if self.crop else None,
            # A random crop depends on these; a center crop or a resize does not.
            "crop_seed": [self.seed, self.dataset_id, self.crop_id(sample_id)] if random_crop
            else None,
            **({"reference_of": [self.reference_of[sample_id][0],
                                 *self.reference_of[sample_id][1]]} if self.reference_of else {}),
            # Only when set, so the keys of caches built without it stay what they were.
            **({"downsample": [self.downsample.resolution_type, self.downsample.maximum,
                               self.downsample.target]} if self.downsample else {}),
            **({"frames": frames} if frames is not None else {}),
            **({"fps": fps} if fps is not None else {}),
            **({"first_frame_condition": True} if self.first_frame_condition else {}),
            # the skip policy too: an entry a video-only run left for a silent clip is not reused
            **({"audio": [self.audio.sample_rate, self.audio.channels, self.skip_silent]}
               if self.audio is not None and frames is not None else {}),
            **({"mask": self.mask_of[sample_id].name} if self.mask_of else {}),
        })


@dataclass(frozen=True)
class Target:
    """What one sample is fitted to: (width, height), a clip's frame count (None: image) and
    the rate a clip is re-timed to (None: its own)."""

    size: tuple[int, int]
    frames: int | None = None
    fps: int | None = None

    @property
    def kind(self) -> str:
        return "image" if self.frames is None else "clip"


@dataclass(frozen=True)
class CachedLatents:
    latents: torch.Tensor                      # [B, C, h, w] or [B, C, F, h, w] (video)
    original_sizes: list[tuple[int, int]]      # (height, width)
    crop_top_lefts: list[tuple[int, int]]      # (top, left)
    target_sizes: list[tuple[int, int]]        # (height, width)
    conditioning: dict[str, torch.Tensor] = field(default_factory=dict)  # each [B, ...]


@dataclass
class LatentCache:
    """Where each sample's entry lives; read-only once built."""

    folder: Path
    paths: dict[str, Path] = field(default_factory=dict)  # sample id -> entry file

    def missing(self, sample_ids: Sequence[str]) -> list[str]:
        """Samples whose entry is absent: after caching on every rank this is empty unless the
        cache folder is not shared by all ranks."""
        return [s for s in sample_ids if s not in self.paths or not self.paths[s].exists()]

    def load(self, sample_ids: Sequence[str]) -> CachedLatents:
        entries = []
        for sample_id in sample_ids:
            try:
                entries.append(load_entry(self.paths[sample_id], f"latent of {sample_id!r}"))
            except (KeyError, FileNotFoundError) as error:
                raise FileNotFoundError(
                    f"no cached latent for sample {sample_id!r} in {self.folder}; the cache "
                    "folder must be on storage every rank can read") from error
        geometry = [e["geometry"].tolist() for e in entries]
        return CachedLatents(
            latents=torch.stack([e["latent"] for e in entries]),
            original_sizes=[(g[0], g[1]) for g in geometry],
            crop_top_lefts=[(g[2], g[3]) for g in geometry],
            target_sizes=[(g[4], g[5]) for g in geometry],
            conditioning={name: torch.stack([e[name] for e in entries])
                          for name in entries[0] if name not in ENTRY_PARTS},
        )


@dataclass
class LatentCacheResult:
    cache: LatentCache
    failures: dict[str, str]   # sample id -> reason, found on this rank (merge before use)
    encoded: int               # entries this rank wrote
    silent: list[str] = field(default_factory=list)  # clips it wrote without audio (video-only)


def _planned_entries(index: DatasetIndex, settings: LatentSettings
                     ) -> tuple[LatentCache, dict[str, Target], dict[str, str]]:
    """Every sample's entry path and what to decode of it; the samples whose file cannot be
    read, with the reason."""
    cache = LatentCache(settings.folder)
    failures: dict[str, str] = {}
    targets: dict[str, Target] = {}
    # One bulk call: for S3 a listing, not a request per sample.
    versions = settings.storage.versions([s for ids in index.buckets.values() for s in ids])
    for bucket, sample_ids in index.buckets.items():
        size = parse_bucket_key(bucket)
        for sample_id in sample_ids:
            plan = index.clips.get(sample_id)
            target = (Target(size) if plan is None
                      else Target(size, bucket_frames(bucket), plan.retimed_fps))
            version = versions.get(sample_id)
            if version is None:
                failures[sample_id] = f"cannot read {target.kind} file: missing or unreadable"
                continue
            key = settings.key(sample_id, size, version.size, version.change_key, target.frames,
                               target.fps)
            cache.paths[sample_id] = entry_path(settings.folder, key)
            targets[sample_id] = target
    return cache, targets, failures


def cache_latents(index: DatasetIndex, settings: LatentSettings, encode_images: EncodeImages,
                  *, rank: int = 0, world_size: int = 1, batch_size: int = 8,
                  decode_workers: int = 2, progress: bool = True) -> LatentCacheResult:
    """Plan every sample's entry, encode the missing ones of this rank's share in batches of
    one bucket, and return the cache plus the samples that could not be read."""
    cache, targets, failures = _planned_entries(index, settings)
    todo = [s for s in rank_share(list(cache.paths), rank, world_size)
            if not cache.paths[s].exists()]
    by_target: dict[tuple[tuple[int, int], int], list[str]] = {}
    for sample_id in todo:  # one batch: one size and frame count
        target = targets[sample_id]
        by_target.setdefault((target.size, target.frames or 0), []).append(sample_id)
    chunks = [ids[i:i + batch_size] for _, ids in sorted(by_target.items())
              for i in range(0, len(ids), batch_size)]

    encoded, silent = 0, []
    bar = tqdm(total=len(todo), desc=f"caching latents [{settings.dataset_id}]", unit="file",
               disable=not progress or not todo)
    workers = max(1, decode_workers)
    if settings.storage.remote:  # a read waits a round trip: fetch a whole chunk at once
        workers = max(workers, min(batch_size, settings.storage.max_connections))
    with ThreadPoolExecutor(max_workers=workers) as pool, bar:
        for chunk, prepared in _prefetched(pool, chunks, settings, targets):
            ready = []
            for sample_id, outcome in zip(chunk, prepared):
                if not isinstance(outcome, str):
                    ready.append((sample_id, outcome))
                else:
                    failures[sample_id] = outcome
            if ready:
                silent += _encode_and_save(ready, settings, encode_images, cache)
                encoded += len(ready)
            bar.update(len(chunk))
    if silent:
        named = ", ".join(printable(s) for s in silent[:3])
        logger.warning("dataset %r: %d clips have no audio stream and train video-only (%s%s); "
                       "video.missing_audio 'skip' leaves them out", settings.dataset_id,
                       len(silent), named, " ..." if len(silent) > 3 else "")
    return LatentCacheResult(cache, failures, encoded, silent)


def _encode_and_save(ready: list[tuple[str, PreparedImage | PreparedClip]],
                     settings: LatentSettings, encode_images: EncodeImages,
                     cache: LatentCache) -> list[str]:
    """Encode one batch of prepared samples (one target) and write each one's entry; return
    the clips among them without audio (trained video-only)."""
    options = {"first_frame_condition": True} if settings.first_frame_condition else {}
    clips = settings.audio is not None and isinstance(ready[0][1], PreparedClip)
    if clips:
        options["audio"] = [clip.audio for _, clip in ready]
    with torch.no_grad():
        parts = encode_images(torch.stack([p.pixels for _, p in ready]), **options)
    if not isinstance(parts, dict):
        parts = {"latent": parts}
    parts = {k: v.detach().to("cpu", torch.float32) for k, v in parts.items()}
    for row, (sample_id, image) in enumerate(ready):
        geometry = torch.tensor([*image.original_size, *image.crop_top_left, *image.target_size],
                                dtype=torch.int64)
        entry = {**{k: v[row] for k, v in parts.items()}, "geometry": geometry}
        if clips:  # the source time the frames and their audio cover
            entry["audio_span"] = torch.tensor([image.span.start, image.span.duration],
                                               dtype=torch.float64)
        save_entry(cache.paths[sample_id], entry)
    return [sample_id for sample_id, clip in ready if clips and clip.audio is None]


def _prefetched(pool: ThreadPoolExecutor, chunks: list[list[str]], settings: LatentSettings,
                targets: dict[str, Target]) -> Iterator[tuple[list[str], list]]:
    """Decode chunk i+1 on worker threads while chunk i is being encoded."""
    def submit(chunk):
        return [pool.submit(_prepare, settings, s, targets[s]) for s in chunk]

    pending = submit(chunks[0]) if chunks else []
    for position, chunk in enumerate(chunks):
        current = pending
        pending = submit(chunks[position + 1]) if position + 1 < len(chunks) else []
        try:
            prepared = [future.result() for future in current]
        except BaseException:
            for future in (*current, *pending):  # the run stops: start no further read
                future.cancel()
            raise
        yield chunk, prepared


def fitted_image(settings: LatentSettings, sample_id: str,
                 size: tuple[int, int]) -> PreparedImage | str:
    """An image sample as its latent entry is made from (``size``: its bucket's (w, h)), or
    why its file cannot be used."""
    return _prepare(settings, sample_id, Target(size))


def _prepare(settings: LatentSettings, sample_id: str,
             target: Target) -> PreparedImage | PreparedClip | str:
    """The prepared image or clip, or why the file cannot be used: gone since it was listed,
    read but not decodable, or a clip shorter than its bucket. A failed read raises (see the
    module docstring)."""
    try:  # read first: Pillow reports a bad file as an OSError too, so the two must not mix
        data = settings.storage.read_bytes(sample_id)
    except FileNotFoundError as error:  # removed since it was listed, or never there (a table)
        return f"cannot read {target.kind} file: missing ({type(error).__name__}: {error})"
    fitting = dict(crop=settings.crop, crop_style=settings.crop_style, seed=settings.seed,
                   dataset_id=settings.dataset_id, sample_id=settings.crop_id(sample_id),
                   downsample=settings.downsample)
    try:
        if target.frames is not None:
            clip = prepare_clip(data, target.size, target.frames, fps=target.fps,
                                audio=settings.audio, **fitting)
            if settings.audio is not None and clip.audio is None and settings.skip_silent:
                return "has no audio stream (video.missing_audio: 'skip')"
            return clip
        image = prepare_image(data, target.size, **fitting,
                              resize_first=(settings.reference_of[sample_id][1]
                                            if settings.reference_of else None))
    except Exception as error:  # noqa: BLE001 - any decoder error means "unusable file"
        return f"failed to decode while caching latents: {type(error).__name__}: {error}"
    if settings.mask_of:
        weights = load_entry(settings.mask_of[sample_id], f"mask of {sample_id!r}")["latent"]
        image = replace(image, pixels=masked_pixels(image.pixels, weights))
    return image
