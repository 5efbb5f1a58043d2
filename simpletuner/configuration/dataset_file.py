"""multidatabackend.json's entries -> the enabled DatasetConfigs, with config.json's settings
inherited and folders made absolute; every problem of every entry reported at once.
Each entry's problems carry its JSON path ``datasets[<index>]`` (errors.py)."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from simpletuner.configuration.dataset_checks import (check_bucket_tail_applies,
                                                      check_caption_and_crop_options,
                                                      check_video_sources)
from simpletuner.configuration.datasets import (
    STORAGE_TYPES, DatasetConfig, check_storage_keys, parse_parquet_block,
)
from simpletuner.configuration.embed_entries import (EmbedCacheEntry, apply_embed_entries,
                                                     is_embed_entry, parse_embed_entry)
from simpletuner.configuration.errors import DATASETS, Location, Problem
from simpletuner.configuration.fields import parse_fields
from simpletuner.configuration.huggingface_block import (
    check_huggingface_keys, parse_huggingface_block, with_absolute_paths,
)
from simpletuner.configuration.options import TrainingConfig
from simpletuner.configuration.placeholders import fill_placeholders
from simpletuner.configuration.schedule_checks import check_dataset_schedule
from simpletuner.configuration.simpletuner_options import MULTIDATABACKEND_JSON
from simpletuner.configuration.video_block import check_video_dataset, parse_video_block
from simpletuner.dataset_kinds import default_kind, kind_named

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PIXEL_TYPES = ("pixel", "pixel_area")  # resolution types whose resolution counts pixels
INHERITED_SIZES = ("minimum_image_size", "maximum_image_size", "target_downsample_size")


def resolve(path: str, base: Path) -> Path:
    """Relative paths are taken from the working directory, as SimpleTuner does."""
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else (base / expanded)


def dataset_file_location(backend_path: str, raw: Any) -> Location:
    """The dataset file's list, knowing its entries' ids (checks after parsing name datasets
    by id)."""
    ids = tuple(item.get("id") if isinstance(item, dict) else None
                for item in (raw if isinstance(raw, list) else []))
    return Location(backend_path, DATASETS, entry_ids=ids)


def _check_dataset(ds: DatasetConfig, where: Location, base: Path, problems: list[Problem]) -> None:
    if not _SAFE_ID.match(ds.id):
        problems.append(where.problem(
            "id", f"key 'id' is {ds.id!r}",
            "use letters, digits, '.', '_' or '-' (it names cache files)"))
    if ds.type not in STORAGE_TYPES:
        problems.append(where.problem(
            "type", f"key 'type' is {ds.type!r}: not supported yet (supported: "
            f"{', '.join(STORAGE_TYPES)})"))
    check_storage_keys(ds, where, problems)
    check_huggingface_keys(ds, where, base, problems)
    if ds.caption_strategy == "instanceprompt" and not ds.instance_prompt:
        problems.append(where.problem(
            "instance_prompt", "key 'instance_prompt' is required when caption_strategy is "
            "'instanceprompt'"))
    low, high = ds.minimum_aspect_ratio, ds.maximum_aspect_ratio
    if low and high and low > high:  # 0 is SimpleTuner's "no limit": the default applies
        problems.append(where.problem(
            "minimum_aspect_ratio", f"key 'minimum_aspect_ratio' ({low}) is larger than "
            f"'maximum_aspect_ratio' ({high})"))
    low, high = ds.minimum_image_size, ds.maximum_image_size
    if low is not None and high is not None and low > high:
        problems.append(where.problem(
            "minimum_image_size", f"key 'minimum_image_size' ({low}) is larger than "
            f"'maximum_image_size' ({high})"))
    # float(): an inherited default may be an int, which has no is_integer() before Python 3.12
    if (ds.resolution_type in PIXEL_TYPES and ds.resolution is not None
            and not float(ds.resolution).is_integer()):
        problems.append(where.problem(
            "resolution", f"key 'resolution' is {ds.resolution}; with resolution_type "
            f"'{ds.resolution_type}' it must be a whole number of pixels"))
    check_caption_and_crop_options(ds, where, problems)
    check_video_sources(ds, where, problems)
    if not ds.disabled and ds.type != "aws" and ds.instance_data_dir is not None:
        _check_folder(ds.instance_data_dir, where, base, problems)


def _check_folder(instance_data_dir: str, where: Location, base: Path,
                  problems: list[Problem]) -> None:
    folder = resolve(instance_data_dir, base)
    if not folder.is_dir():
        problems.append(where.problem(
            "instance_data_dir", f"key 'instance_data_dir': folder {folder} does not exist"))
    elif not os.access(folder, os.R_OK | os.X_OK):
        problems.append(where.problem(
            "instance_data_dir", f"key 'instance_data_dir': folder {folder} is not readable"))


def parse_datasets(raw: Any, where: Location, training: TrainingConfig | None, base: Path,
                   problems: list[Problem]) -> list[DatasetConfig]:
    """Enabled datasets with inherited settings filled in and folders made absolute."""
    if not isinstance(raw, list):
        problems.append(where.problem(
            "", f"expected a JSON list of dataset objects, found {type(raw).__name__}"))
        return []
    datasets: list[DatasetConfig] = []
    embed_entries: list[EmbedCacheEntry] = []
    first_index: dict[str, int] = {}
    enabled_types: dict[str, str] = {}  # name -> dataset_type of every enabled one, usable or not
    for index, item in enumerate(raw):
        name = f"dataset [{index}]"
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            name += f" (id '{item['id']}')"
        label = where.within(f"[{index}]", name)
        if not isinstance(item, dict):
            problems.append(label.problem(
                "", f"expected a JSON object, found {type(item).__name__}"))
            continue
        if training is not None:
            item = fill_placeholders(item, {
                "model_family": training.model_family, "id": str(item.get("id", "")),
                "output_dir": str(resolve(training.output_dir, base))})
        if is_embed_entry(item):
            entry = parse_embed_entry(item, label, problems)
            if entry is not None:
                _claim_id(entry.id, index, label, first_index, problems)
                embed_entries.append(entry)
            continue
        before = len(problems)
        values = parse_fields(DatasetConfig, item, label, problems, MULTIDATABACKEND_JSON)
        usable = len(problems) == before
        if not values.get("disabled", False):
            enabled_types[name] = values.get("dataset_type", default_kind().name)
        usable = _parse_blocks(values, label, problems) and usable
        check_video_dataset(values.get("dataset_type", default_kind().name), item.get("video"),
                            values.get("video"),
                            training.model_family if training is not None else None, label,
                            problems)
        if "id" not in values:
            if "instance_data_dir" in values and not values.get("disabled", False):
                _check_folder(values["instance_data_dir"], label, base, problems)
            continue
        # Checked even when other keys were wrong, so one run reports every problem.
        ds = DatasetConfig(**values)
        if not _claim_id(ds.id, index, label, first_index, problems):
            usable = False  # its other keys are still checked below
        check_bucket_tail_applies(ds, label, problems)
        if training is not None:
            ds = _inherit(ds, training)
        _check_dataset(ds, label, base, problems)
        if usable and not ds.disabled:
            datasets.append(_with_absolute_paths(ds, base))
    if isinstance(raw, list) and not datasets and not problems:
        problems.append(where.problem("", "no enabled dataset; add one or set 'disabled': false"))
    _check_something_trains(enabled_types, where, problems)
    check_dataset_schedule(datasets, training, where, problems)
    return apply_embed_entries(datasets, embed_entries, where, problems)


def _parse_blocks(values: dict, label: Location, problems: list[Problem]) -> bool:
    """The entry's ``parquet`` or ``huggingface`` block, parsed in place; False when unusable."""
    usable = True
    if values.get("metadata_backend") == "parquet":
        values["parquet"] = parse_parquet_block(values.get("parquet"), label, problems)
        usable = values["parquet"] is not None
    if kind_named(values.get("dataset_type", default_kind().name)).has_clips:
        values["video"] = parse_video_block(values.get("video"), label, problems)
        usable = usable and values["video"] is not None
    if values.get("type") == "huggingface":
        # SimpleTuner's defaults for this type; given values are checked against it
        values.setdefault("caption_strategy", "huggingface")
        values.setdefault("metadata_backend", "huggingface")
        values["huggingface"] = parse_huggingface_block(values, label, problems)
        usable = usable and values["huggingface"] is not None
    return usable


def _inherit(ds: DatasetConfig, training: TrainingConfig) -> DatasetConfig:
    """config.json's values for the dataset settings this dataset leaves unset."""
    return replace(
        ds,
        resolution=ds.resolution if ds.resolution is not None else training.resolution,
        resolution_type=ds.resolution_type or training.resolution_type,
        caption_dropout_probability=(
            ds.caption_dropout_probability if ds.caption_dropout_probability is not None
            else training.caption_dropout_probability),
        bucket_tail=ds.bucket_tail or training.bucket_tail,
        **{key: getattr(training, key) for key in INHERITED_SIZES if getattr(ds, key) is None},
    )


def _check_something_trains(enabled_types: dict[str, str], where: Location,
                            problems: list[Problem]) -> None:
    """Eval datasets are only evaluated: with nothing else the run would fail only once the
    model is loaded and every dataset cached."""
    if enabled_types and not any(kind_named(name).trains for name in enabled_types.values()):
        problems.append(where.problem(
            "", f"every enabled dataset has 'dataset_type': 'eval' ({'; '.join(enabled_types)}), "
            "which is evaluated, never trained on; add a dataset to train on ('dataset_type': "
            "'image', the default)"))


def _claim_id(dataset_id: str, index: int, label: Location, first_index: dict[str, int],
              problems: list[Problem]) -> bool:
    """Record the first use of an id; a later one is a problem. False when already taken."""
    if dataset_id in first_index:
        problems.append(label.problem(
            "id", f"key 'id': duplicate id '{dataset_id}' (also dataset "
            f"[{first_index[dataset_id]}])"))
        return False
    first_index[dataset_id] = index
    return True


def _with_absolute_paths(ds: DatasetConfig, base: Path) -> DatasetConfig:
    if ds.instance_data_dir is not None:
        ds = replace(ds, instance_data_dir=str(resolve(ds.instance_data_dir, base).resolve()))
    if ds.parquet is not None:
        ds = replace(ds, parquet={**ds.parquet, "path": str(resolve(ds.parquet["path"], base))})
    if ds.type == "huggingface":
        ds = replace(ds, huggingface=with_absolute_paths(ds.huggingface, base))
    return ds
