"""SimpleTuner's ``conditioning`` block on a dataset: conditioning datasets generated from the
dataset's own images with no model (helpers/caching/generators.py makes them while caching).
Each block becomes a conditioning dataset '<id>_conditioning_<type>' over the same files, which
the dataset names in its conditioning_data, as SimpleTuner names and links it. Torch-free."""

from __future__ import annotations

from dataclasses import replace

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import Location, Problem

GENERATED = ("canny",)  # the generators helpers/caching/generators.py has
KNOWN_KEYS = {"type", "conditioning_type", "low_threshold", "high_threshold", "captions"}


def _blocks(value: object) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def with_generated(datasets: list[DatasetConfig], where: Location,
                   problems: list[Problem]) -> list[DatasetConfig]:
    """``datasets`` with every conditioning block made its conditioning dataset (after the
    dataset naming it), every problem of the blocks appended to ``problems``."""
    expanded = []
    for ds in datasets:
        blocks = _blocks(ds.conditioning)
        if not blocks:
            expanded.append(ds)
            continue
        label = where.entry(ds.id, f"dataset '{ds.id}'")
        made = [generated for block in blocks
                if (generated := _generated(ds, block, label, problems)) is not None]
        named = [*ds.conditioning_ids(), *(g.id for g in made)]
        expanded.append(replace(ds, conditioning=None, conditioning_data=named or None))
        expanded.extend(made)
    return expanded


def _generated(ds: DatasetConfig, block: object, label: Location,
               problems: list[Problem]) -> DatasetConfig | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in GENERATED:
        problems.append(label.problem(
            "conditioning", f"key 'conditioning': generator {kind!r} is not available here; "
            "'canny' (edges computed locally, no model) is; give other conditioning images as "
            "a conditioning dataset named in conditioning_data"))
        return None
    unknown = sorted(set(block) - KNOWN_KEYS)
    wanted = block.get("conditioning_type", "controlnet")
    thresholds = [block.get(key, 0) for key in ("low_threshold", "high_threshold")]
    if unknown or wanted != "controlnet" or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t
            for t in thresholds):
        problems.append(label.problem(
            "conditioning", f"key 'conditioning': a 'canny' block takes {sorted(KNOWN_KEYS)} "
            f"(found {sorted(block)}), conditioning_type 'controlnet' (ControlNet control "
            "images) and thresholds of 0 or more on 0-255 grey levels"))
        return None
    return replace(ds, id=f"{ds.id}_conditioning_{kind}", dataset_type="conditioning",
                   conditioning_type="controlnet", conditioning_data=None, conditioning=block,
                   cache_dir_vae=None)
