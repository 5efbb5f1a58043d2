"""Checks of one dataset's options that need several keys: captions, crops, bucket_tail, where
clips can come from."""

from __future__ import annotations

from simpletuner.configuration.datasets import ASPECT_KEY, WEIGHT_KEY, DatasetConfig
from simpletuner.configuration.errors import Location, Problem
from simpletuner.dataset_kinds import kind_of


def check_caption_and_crop_options(ds: DatasetConfig, where: Location,
                                   problems: list[Problem]) -> None:
    for key in ("prepend_instance_prompt", "only_instance_prompt"):
        if getattr(ds, key) and not ds.instance_prompt:
            problems.append(where.problem(key, f"key '{key}' needs 'instance_prompt'"))
    if ds.crop_aspect in ("closest", "random"):
        _check_aspect_buckets(ds, where, problems)
    elif ds.crop_aspect_buckets is not None:
        problems.append(where.problem(
            "crop_aspect_buckets", "key 'crop_aspect_buckets' is used with crop_aspect 'closest' "
            f"or 'random' only; crop_aspect is '{ds.crop_aspect}'"))


def check_bucket_tail_applies(ds: DatasetConfig, where: Location, problems: list[Problem]) -> None:
    """Before config.json's bucket_tail is filled in: set on an eval dataset it would be
    ignored, which is a mistake to report, not to drop silently."""
    if not kind_of(ds).trains and ds.bucket_tail is not None:
        problems.append(where.problem(
            "bucket_tail", "key 'bucket_tail' shapes training epochs; an 'eval' dataset "
            "evaluates every sample exactly once whatever it says. Remove it."))


def check_video_sources(ds: DatasetConfig, where: Location, problems: list[Problem]) -> None:
    """Clips are files of a folder or a bucket, each probed; a metadata table may name them and
    caption them, but the storage is listed (the probes need the files)."""
    if not kind_of(ds).has_clips:
        return
    if ds.type == "huggingface":
        problems.append(where.problem(
            "dataset_type", "'dataset_type': 'video' reads clip files from type 'local' or "
            "'aws'; a datasets-library split of clips is not read here"))
    elif isinstance(ds.parquet, dict) and ds.parquet.get("trust_table"):
        problems.append(where.problem(
            "parquet.trust_table", "parquet.trust_table skips listing the storage, but every "
            "clip is probed for its frames; set trust_table false for a video dataset"))


def _check_aspect_buckets(ds: DatasetConfig, where: Location, problems: list[Problem]) -> None:
    mode = ds.crop_aspect
    if not ds.crop:
        problems.append(where.problem(
            "crop_aspect", f"key 'crop_aspect' '{mode}' needs 'crop': true"))
    if not ds.crop_aspect_buckets:
        problems.append(where.problem(
            "crop_aspect", f"key 'crop_aspect' '{mode}' needs 'crop_aspect_buckets' (aspect "
            "ratios W/H, e.g. [0.75, 1.0, 1.5])"))
        return
    entries = ds.crop_aspect_buckets
    weighted = [entry for entry in entries if isinstance(entry, dict)]
    if weighted and mode != "random":
        problems.append(where.problem(
            "crop_aspect_buckets", "key 'crop_aspect_buckets': weights are used with crop_aspect "
            "'random' only; list plain aspect ratios for 'closest'"))
    if any(set(entry) != {ASPECT_KEY, WEIGHT_KEY} or not all(
            _is_number(entry[key]) for key in (ASPECT_KEY, WEIGHT_KEY)) for entry in weighted):
        problems.append(where.problem(
            "crop_aspect_buckets", "key 'crop_aspect_buckets': a weighted entry is "
            f"{{\"{ASPECT_KEY}\": <W/H>, \"{WEIGHT_KEY}\": <number >= 0>}}"))
        return
    pairs = ds.weighted_crop_aspects()
    if any(aspect <= 0 for aspect, _ in pairs):
        problems.append(where.problem(
            "crop_aspect_buckets", "key 'crop_aspect_buckets' must hold positive aspect ratios"))
    if any(weight < 0 for _, weight in pairs) or sum(weight for _, weight in pairs) <= 0:
        problems.append(where.problem(
            "crop_aspect_buckets", "key 'crop_aspect_buckets': weights must be >= 0, and not all "
            "0"))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
