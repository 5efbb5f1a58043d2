"""Pure bucket math: an image size -> the training size it is resized to -> its bucket key "WxH".

``pixel``: the short edge becomes ``resolution`` (rounded to the alignment) and the long edge
keeps the aspect ratio, rounded to the alignment. ``area``: ``resolution`` is megapixels
(1.0 = 1,000,000 pixels); the short edge is chosen among the aligned values next to the ideal one
so W*H is as close to the target as alignment allows, and the long edge again keeps the aspect
ratio rounded to the alignment. Either way the long edge is off by at most alignment/2 from the
exact aspect, so the relative aspect error is at most alignment / (2 * short edge).
``pixel_area`` (SimpleTuner's): ``resolution`` is in pixels and means the area
``resolution**2``; it is ``area`` at ``resolution**2 / 1e6`` megapixels, size filters included
(an edge length ``m`` keeps images of at least ``m**2`` pixels).
Cropping to ``crop_aspect: closest`` trains each image at the aspect of ``crop_aspect_buckets``
nearest its own (ties: the smaller aspect), sized as above. ``crop_aspect: random`` draws the
aspect per sample instead, by weight, from a SHA-256 of (dataset id, sample id): the same sample
gets the same bucket on every rank, run and resume, whatever its own aspect.

Absurd images are refused per file, never bucketed: an aspect beyond 1:8 or 8:1 unless the
dataset's ``minimum_aspect_ratio`` / ``maximum_aspect_ratio`` allow it, and, whatever the
options, any image whose bucket would hold more than ``MAX_BUCKET_AREA_FACTOR`` times the
training area (a 20000x20 strip would otherwise train as one 64000x64 bucket).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from dataclasses import dataclass

from simpletuner.common.names import name_bytes
from simpletuner.configuration import DatasetConfig, TrainingConfig

MEGAPIXEL = 1_000_000
# Twice the widest aspect these families train at (SDXL's buckets span 1:4..4:1), and far below
# the shapes (1000:1 strips, a one-pixel row) that come only from broken or non-photo files.
DEFAULT_MAX_ASPECT = 8.0
# In 'pixel' mode a bucket's area grows with its aspect (the short edge is fixed), and in
# 'area' mode alignment can push a thin bucket past its area; this bounds both, so no bucket
# can need many times the memory the run was sized for.
MAX_BUCKET_AREA_FACTOR = 16


@dataclass(frozen=True)
class BucketSettings:
    resolution: float
    resolution_type: str   # "pixel" | "area"
    alignment: int
    square: bool           # crop with crop_aspect 'square': every image goes to one square bucket
    aspect_buckets: tuple[float, ...] = ()  # crop_aspect 'closest'/'random': the aspects (W/H)
    aspect_weights: tuple[float, ...] = ()  # crop_aspect 'random': each aspect's weight, else ()

    @property
    def draws_aspect(self) -> bool:
        """crop_aspect 'random': the bucket depends on the sample, not on the image size."""
        return bool(self.aspect_weights)

    @property
    def training_area(self) -> int:
        """Pixels of the square training size: the area target, or the short edge squared."""
        if self.resolution_type == "pixel":
            return align(self.resolution, self.alignment) ** 2
        return round(self.resolution * MEGAPIXEL)

    def oversized(self, key: str) -> str | None:
        """Why no image may train in bucket ``key`` (a fixed text per dataset), or None."""
        width, height = parse_bucket_key(key)
        limit = MAX_BUCKET_AREA_FACTOR * self.training_area
        if width * height <= limit:
            return None
        return (f"its bucket would hold more than {MAX_BUCKET_AREA_FACTOR} x the training area "
                f"({limit} pixels)")

    @classmethod
    def for_dataset(cls, dataset: DatasetConfig, training: TrainingConfig) -> "BucketSettings":
        resolution = dataset.resolution if dataset.resolution is not None else training.resolution
        resolution_type = dataset.resolution_type or training.resolution_type
        if resolution_type == "pixel_area":
            resolution, resolution_type = float(resolution) ** 2 / MEGAPIXEL, "area"
        listed = dataset.crop and dataset.crop_aspect in ("closest", "random")
        weighted = sorted(dataset.weighted_crop_aspects()) if listed else []
        return cls(
            resolution=float(resolution),
            resolution_type=resolution_type,
            alignment=training.aspect_bucket_alignment,
            square=dataset.crop and dataset.crop_aspect == "square",
            aspect_buckets=tuple(aspect for aspect, _ in weighted),
            aspect_weights=(tuple(weight for _, weight in weighted)
                            if dataset.crop_aspect == "random" else ()),
        )


def align(value: float, alignment: int) -> int:
    """Nearest multiple of ``alignment`` (halves round up), never below ``alignment``."""
    return max(alignment, int(math.floor(value / alignment + 0.5)) * alignment)


def _long_edge(short: int, ratio: float, alignment: int) -> int:
    # ratio = long / short >= 1
    return align(short * ratio, alignment)


def target_size(width: int, height: int, settings: BucketSettings) -> tuple[int, int]:
    """(W, H) in pixels the image is trained at; both multiples of the alignment."""
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if settings.draws_aspect:
        raise ValueError("crop_aspect 'random' decides per sample: use sample_bucket")
    aspect = width / height
    if settings.square:
        aspect = 1.0
    elif settings.aspect_buckets:
        aspect = min(settings.aspect_buckets, key=lambda a: abs(a - aspect))
    return size_at_aspect(aspect, settings)


def drawn_aspect(dataset_id: str, sample_id: str, settings: BucketSettings) -> float:
    """crop_aspect 'random': the sample's aspect, drawn by weight from a digest of its ids.
    The tag keeps the draw independent of max_num_samples, which digests the same ids."""
    payload = name_bytes(f"crop_aspect\x00{dataset_id}\x00{sample_id}")
    # 53 bits: exactly representable, so the point stays below 1 and zero weights are never hit
    unit = (int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") >> 11) / 2**53
    cumulative = list(itertools.accumulate(settings.aspect_weights))
    chosen = bisect.bisect_right(cumulative, unit * cumulative[-1])
    return settings.aspect_buckets[min(chosen, len(cumulative) - 1)]


def size_at_aspect(aspect: float, settings: BucketSettings) -> tuple[int, int]:
    """(W, H) of the bucket for ``aspect`` (W/H) at the settings' resolution."""
    al = settings.alignment
    ratio = max(aspect, 1 / aspect)
    if settings.resolution_type == "pixel":
        short = align(settings.resolution, al)
        long = _long_edge(short, ratio, al)
    else:
        area = settings.resolution * MEGAPIXEL
        ideal_short = math.sqrt(area / ratio)
        lower = max(al, int(ideal_short // al) * al)
        candidates = [(s, _long_edge(s, ratio, al)) for s in (lower, lower + al)]
        short, long = min(candidates, key=lambda sl: (abs(sl[0] * sl[1] - area), sl[0]))
    return (long, short) if aspect >= 1 else (short, long)


def bucket_key(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def parse_bucket_key(key: str) -> tuple[int, int]:
    """"768x512" -> (768, 512); a clip bucket's size: "768x512@81" -> (768, 512)."""
    width, sep, height = key.split("@", 1)[0].partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise ValueError(f"not a bucket key 'WxH': {key!r}")
    return int(width), int(height)


def bucket_for(width: int, height: int, settings: BucketSettings) -> str:
    return bucket_key(target_size(width, height, settings))


def sample_bucket(dataset_id: str, sample_id: str, width: int, height: int,
                  settings: BucketSettings) -> str:
    """The bucket of one sample: drawn for crop_aspect 'random', else by its size."""
    if settings.draws_aspect:
        return bucket_key(size_at_aspect(drawn_aspect(dataset_id, sample_id, settings), settings))
    return bucket_for(width, height, settings)


@dataclass(frozen=True)
class SizeFilters:
    """Which images a dataset keeps. Sizes are in the dataset's resolution units, as SimpleTuner:
    ``pixel`` compares the short edge in pixels, ``area`` compares megapixels. Aspect is W/H;
    ``for_dataset`` fills in the default aspect limits. Each reason is a fixed text per dataset
    so a report can count skips by reason."""

    resolution_type: str
    minimum_image_size: float | None = None
    maximum_image_size: float | None = None
    minimum_aspect_ratio: float | None = None
    maximum_aspect_ratio: float | None = None

    @classmethod
    def for_dataset(cls, dataset: DatasetConfig, training: TrainingConfig) -> "SizeFilters":
        resolution_type = dataset.resolution_type or training.resolution_type
        low, high = dataset.minimum_image_size, dataset.maximum_image_size
        if dataset.target_downsample_size is not None:
            high = None  # SimpleTuner's pair: larger images are downsampled (image.Downsample)
        if resolution_type == "pixel_area":  # edge lengths -> megapixels of that square
            resolution_type = "area"
            low, high = (None if v is None else v * v / MEGAPIXEL for v in (low, high))
        # Unset or 0 (SimpleTuner's "off"): the default limit, unless the other side's limit
        # lies beyond it (asking for 10:1 and wider lifts the default maximum). None: no limit.
        narrow, wide = dataset.minimum_aspect_ratio or None, dataset.maximum_aspect_ratio or None
        if narrow is None and (wide is None or wide >= 1 / DEFAULT_MAX_ASPECT):
            narrow = 1 / DEFAULT_MAX_ASPECT
        if wide is None and (narrow is None or narrow <= DEFAULT_MAX_ASPECT):
            wide = DEFAULT_MAX_ASPECT
        return cls(resolution_type=resolution_type, minimum_image_size=low,
                   maximum_image_size=high, minimum_aspect_ratio=narrow,
                   maximum_aspect_ratio=wide)

    def reason_to_skip(self, width: int, height: int) -> str | None:
        if self.resolution_type == "pixel":
            size, subject, unit = float(min(width, height)), "short edge", "px"
        else:
            size, subject, unit = width * height / MEGAPIXEL, "area", "megapixels"
        low, high = self.minimum_image_size, self.maximum_image_size
        if low is not None and size < low:
            return f"too small: {subject} below minimum_image_size {low:g} {unit}"
        if high is not None and size > high:
            return f"too large: {subject} above maximum_image_size {high:g} {unit}"
        aspect = width / height
        low, high = self.minimum_aspect_ratio, self.maximum_aspect_ratio
        if (low is not None and aspect < low) or (high is not None and aspect > high):
            lower = "-" if low is None else f"{low:g}"
            upper = "-" if high is None else f"{high:g}"
            default = high == DEFAULT_MAX_ASPECT or low == 1 / DEFAULT_MAX_ASPECT
            return f"aspect ratio (W/H) outside [{lower}, {upper}]" + (
                " (the default limit; minimum_aspect_ratio / maximum_aspect_ratio widen it)"
                if default else "")
        return None
