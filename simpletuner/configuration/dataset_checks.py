"""Checks of the SimpleTuner caption and crop options of one dataset that need several keys."""

from __future__ import annotations

from simpletuner.configuration.datasets import DatasetConfig


def check_caption_and_crop_options(ds: DatasetConfig, where: str, problems: list[str]) -> None:
    for key in ("prepend_instance_prompt", "only_instance_prompt"):
        if getattr(ds, key) and not ds.instance_prompt:
            problems.append(f"{where}: key '{key}' needs 'instance_prompt'")
    if ds.crop_aspect == "closest":
        if not ds.crop:
            problems.append(f"{where}: key 'crop_aspect' 'closest' needs 'crop': true")
        if not ds.crop_aspect_buckets:
            problems.append(f"{where}: key 'crop_aspect' 'closest' needs 'crop_aspect_buckets' "
                            "(aspect ratios W/H, e.g. [0.75, 1.0, 1.5])")
    elif ds.crop_aspect_buckets is not None:
        problems.append(f"{where}: key 'crop_aspect_buckets' is used with crop_aspect "
                        f"'closest' only; crop_aspect is '{ds.crop_aspect}'")
    if any(aspect <= 0 for aspect in ds.crop_aspect_buckets or []):
        problems.append(f"{where}: key 'crop_aspect_buckets' must hold positive aspect ratios")
