"""Load and validate config.json and multidatabackend.json, reporting every problem at once."""

from __future__ import annotations

import json
import math
import os
import re
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simpletuner.configuration.conditioning_checks import CONDITIONING, with_references
from simpletuner.configuration.dataset_checks import (check_bucket_tail_applies,
                                                      check_caption_and_crop_options,
                                                      check_video_sources)
from simpletuner.configuration.datasets import (
    STORAGE_TYPES, DatasetConfig, check_storage_keys, parse_parquet_block,
)
from simpletuner.configuration.edit_validation_checks import check_edit_validation
from simpletuner.configuration.embed_entries import (EmbedCacheEntry, apply_embed_entries,
                                                     is_embed_entry, parse_embed_entry)
from simpletuner.configuration.errors import ConfigError
from simpletuner.configuration.fields import normalise_key, parse_fields
from simpletuner.configuration.huggingface_block import (
    check_huggingface_keys, parse_huggingface_block, with_absolute_paths,
)
from simpletuner.configuration.memory_checks import (check_block_swap_options,
                                                     check_group_offload_options)
from simpletuner.configuration.options import LogLevel, TrainingConfig
from simpletuner.configuration.placeholders import fill_placeholders
from simpletuner.configuration.schedule_checks import check_dataset_schedule
from simpletuner.configuration.simpletuner_options import CONFIG_JSON, MULTIDATABACKEND_JSON
from simpletuner.configuration.training_checks import (check_fsdp_options,
                                                       check_lora_target_all,
                                                       check_loss_options_fit_the_family)
from simpletuner.configuration.validation_options import check_validation_options
from simpletuner.configuration.video_block import check_video_dataset, parse_video_block

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
PIXEL_TYPES = ("pixel", "pixel_area")  # resolution types whose resolution counts pixels
INHERITED_SIZES = ("minimum_image_size", "maximum_image_size", "target_downsample_size")
COMMAND_LINE = "command line"  # where overrides come from, in messages
LOG_LEVEL_ENV = "SIMPLETUNER_LOG_LEVEL"  # SimpleTuner's setting (config.env); log_level wins


@dataclass
class Configuration:
    """Everything a run is configured by: training options plus the enabled datasets."""

    config_path: Path
    training: TrainingConfig
    datasets: list[DatasetConfig]   # trained or evaluated, in file order
    references: list[DatasetConfig] = field(default_factory=list)  # dataset_type conditioning

    def __post_init__(self):  # reference images are paired with the datasets, never trained
        self.references += [ds for ds in self.datasets if ds.dataset_type == CONDITIONING]
        self.datasets = [ds for ds in self.datasets if ds.dataset_type != CONDITIONING]


def _read_json(path: Path, problems: list[str]) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(f"{path}: file not found")
        return None
    except OSError as exc:
        problems.append(f"{path}: cannot be read ({exc.strerror})")
        return None
    repeated: list[str] = []
    try:
        value = json.loads(text, object_pairs_hook=lambda pairs: _object(pairs, repeated))
    except json.JSONDecodeError as exc:
        problems.append(f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}")
        return None
    # json keeps the last of repeated keys silently, which would hide the first value.
    problems.extend(f"{path}: key {key!r} appears more than once in one object; only the last "
                    "would count" for key in dict.fromkeys(repeated))
    return value


def _object(pairs: list[tuple[str, Any]], repeated: list[str]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            repeated.append(key)
        seen[key] = value
    return seen


def _resolve(path: str, base: Path) -> Path:
    """Relative paths are taken from the working directory, as SimpleTuner does."""
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else (base / expanded)


def parse_training(raw: Any, where: str, problems: list[str],
                   base: Path) -> TrainingConfig | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a JSON object of options, found {type(raw).__name__}")
        return None
    before = len(problems)
    values = parse_fields(TrainingConfig, raw, where, problems, CONFIG_JSON)
    resolution_type = values.get("resolution_type", "pixel")
    if resolution_type in PIXEL_TYPES and "resolution" in values:
        if not float(values["resolution"]).is_integer():
            problems.append(f"{where}: key 'resolution' is {values['resolution']}; with "
                            f"resolution_type '{resolution_type}' it must be a whole number of "
                            "pixels")
    check_loss_options_fit_the_family(values, where, problems)
    check_fsdp_options(values, where, problems)
    check_block_swap_options(values, where, problems)
    check_group_offload_options(values, where, base, problems)
    check_lora_target_all(raw, values, where, problems)
    if len(problems) > before:
        return None
    training = TrainingConfig(**values)
    if training.lr_scheduler == "polynomial" and training.lr_end >= training.learning_rate:
        problems.append(f"{where}: key 'lr_end' ({training.lr_end:g}) must be below "
                        f"learning_rate ({training.learning_rate:g}) for lr_scheduler 'polynomial'")
        return None
    if training.validation_resolution is None:
        training.validation_resolution = training_side(training)
    check_validation_options(training, where, base, problems)
    return None if len(problems) > before else training


def training_side(training: TrainingConfig) -> int:
    """The side of a square at the training resolution, on the bucket alignment: what
    validation_resolution defaults to (area types: the square of that area)."""
    side = float(training.resolution)
    if training.resolution_type == "area":
        side = math.sqrt(side * 1_000_000)
    alignment = training.aspect_bucket_alignment
    return max(alignment, int(math.floor(side / alignment + 0.5)) * alignment)


def _check_dataset(ds: DatasetConfig, where: str, base: Path, problems: list[str]) -> None:
    if not _SAFE_ID.match(ds.id):
        problems.append(f"{where}: key 'id' is {ds.id!r}; use letters, digits, '.', '_' or '-' "
                        "(it names cache files)")
    if ds.type not in STORAGE_TYPES:
        problems.append(f"{where}: key 'type' is {ds.type!r}: not supported yet "
                        f"(supported: {', '.join(STORAGE_TYPES)})")
    check_storage_keys(ds, where, problems)
    check_huggingface_keys(ds, where, base, problems)
    if ds.caption_strategy == "instanceprompt" and not ds.instance_prompt:
        problems.append(f"{where}: key 'instance_prompt' is required when caption_strategy "
                        "is 'instanceprompt'")
    low, high = ds.minimum_aspect_ratio, ds.maximum_aspect_ratio
    if low and high and low > high:  # 0 is SimpleTuner's "no limit": the default applies
        problems.append(f"{where}: key 'minimum_aspect_ratio' ({low}) is larger than "
                        f"'maximum_aspect_ratio' ({high})")
    low, high = ds.minimum_image_size, ds.maximum_image_size
    if low is not None and high is not None and low > high:
        problems.append(f"{where}: key 'minimum_image_size' ({low}) is larger than "
                        f"'maximum_image_size' ({high})")
    # float(): an inherited default may be an int, which has no is_integer() before Python 3.12
    if (ds.resolution_type in PIXEL_TYPES and ds.resolution is not None
            and not float(ds.resolution).is_integer()):
        problems.append(f"{where}: key 'resolution' is {ds.resolution}; with resolution_type "
                        f"'{ds.resolution_type}' it must be a whole number of pixels")
    check_caption_and_crop_options(ds, where, problems)
    check_video_sources(ds, where, problems)
    if not ds.disabled and ds.type != "aws" and ds.instance_data_dir is not None:
        _check_folder(ds.instance_data_dir, where, base, problems)


def _check_folder(instance_data_dir: str, where: str, base: Path, problems: list[str]) -> None:
    folder = _resolve(instance_data_dir, base)
    if not folder.is_dir():
        problems.append(f"{where}: key 'instance_data_dir': folder {folder} does not exist")
    elif not os.access(folder, os.R_OK | os.X_OK):
        problems.append(f"{where}: key 'instance_data_dir': folder {folder} is not readable")


def parse_datasets(raw: Any, where: str, training: TrainingConfig | None, base: Path,
                   problems: list[str]) -> list[DatasetConfig]:
    """Enabled datasets with inherited settings filled in and folders made absolute."""
    if not isinstance(raw, list):
        problems.append(f"{where}: expected a JSON list of dataset objects, "
                        f"found {type(raw).__name__}")
        return []
    datasets: list[DatasetConfig] = []
    embed_entries: list[EmbedCacheEntry] = []
    first_index: dict[str, int] = {}
    enabled_types: dict[str, str] = {}  # name -> dataset_type of every enabled one, usable or not
    for index, item in enumerate(raw):
        name = f"dataset [{index}]"
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            name += f" (id '{item['id']}')"
        label = f"{where}: {name}"
        if not isinstance(item, dict):
            problems.append(f"{label}: expected a JSON object, found {type(item).__name__}")
            continue
        if training is not None:
            item = fill_placeholders(item, {
                "model_family": training.model_family, "id": str(item.get("id", "")),
                "output_dir": str(_resolve(training.output_dir, base))})
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
            enabled_types[name] = values.get("dataset_type", "image")
        usable = _parse_blocks(values, label, problems) and usable
        check_video_dataset(values.get("dataset_type", "image"), item.get("video"),
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
        problems.append(f"{where}: no enabled dataset; add one or set 'disabled': false")
    _check_something_trains(enabled_types, where, problems)
    check_dataset_schedule(datasets, training, where, problems)
    return apply_embed_entries(datasets, embed_entries, where, problems)


def _parse_blocks(values: dict, label: str, problems: list[str]) -> bool:
    """The entry's ``parquet`` or ``huggingface`` block, parsed in place; False when unusable."""
    usable = True
    if values.get("metadata_backend") == "parquet":
        values["parquet"] = parse_parquet_block(values.get("parquet"), label, problems)
        usable = values["parquet"] is not None
    if values.get("dataset_type") == "video":
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


def _check_something_trains(enabled_types: dict[str, str], where: str,
                            problems: list[str]) -> None:
    """Eval datasets are only evaluated: with nothing else the run would fail only once the
    model is loaded and every dataset cached."""
    if enabled_types and set(enabled_types.values()) <= {"eval", CONDITIONING}:
        problems.append(f"{where}: every enabled dataset has 'dataset_type': 'eval' "
                        f"({'; '.join(enabled_types)}), which is evaluated, never trained on; "
                        "add a dataset to train on ('dataset_type': 'image', the default)")


def _claim_id(dataset_id: str, index: int, label: str, first_index: dict[str, int],
              problems: list[str]) -> bool:
    """Record the first use of an id; a later one is a problem. False when already taken."""
    if dataset_id in first_index:
        problems.append(f"{label}: key 'id': duplicate id '{dataset_id}' "
                        f"(also dataset [{first_index[dataset_id]}])")
        return False
    first_index[dataset_id] = index
    return True


def _with_absolute_paths(ds: DatasetConfig, base: Path) -> DatasetConfig:
    if ds.instance_data_dir is not None:
        ds = replace(ds, instance_data_dir=str(_resolve(ds.instance_data_dir, base).resolve()))
    if ds.parquet is not None:
        ds = replace(ds, parquet={**ds.parquet, "path": str(_resolve(ds.parquet["path"], base))})
    if ds.type == "huggingface":
        ds = replace(ds, huggingface=with_absolute_paths(ds.huggingface, base))
    return ds


def _raw_option(raw: Any, key: str) -> Any:
    if not isinstance(raw, dict):
        return None
    return raw.get(key, raw.get(f"--{key}"))


def _apply_overrides(raw: dict, overrides: dict[str, Any], problems: list[str]) -> dict:
    """Command-line values replace the file's (with or without '--'); each is checked here so a
    mistake names the command line, and only accepted ones reach the file's checks."""
    accepted = parse_fields(TrainingConfig, overrides, COMMAND_LINE, problems, CONFIG_JSON,
                            check_required=False)
    # SimpleTuner's "not set" on the command line (--max_train_steps 0) unsets the file's value.
    unset = {name for name, value in ((CONFIG_JSON.canonical(normalise_key(k)), v)
                                      for k, v in overrides.items())
             if CONFIG_JSON.means_not_set(name, value)}
    kept = {key: value for key, value in raw.items()
            if CONFIG_JSON.canonical(normalise_key(key)) not in {*accepted, *unset}}
    return {**kept, **accepted}


def _log_level(training: TrainingConfig, problems: list[str]) -> str | None:
    """config.json's log_level, else SimpleTuner's environment variable (any case), else INFO."""
    if training.log_level is not None:
        return training.log_level
    value = os.environ.get(LOG_LEVEL_ENV, "INFO")
    levels = typing.get_args(LogLevel)
    if value.upper() not in levels:
        problems.append(f"environment variable {LOG_LEVEL_ENV} is {value!r}; use one of "
                        f"{', '.join(levels)}, or set log_level in config.json")
        return None
    return value.upper()


def load_configuration(config_path: str | os.PathLike, *, cwd: Path | None = None,
                       overrides: dict[str, Any] | None = None) -> Configuration:
    """Read both files; raise one ConfigError listing every problem found in either.
    ``overrides`` are config.json options from the command line (see command_line.py)."""
    base = cwd or Path.cwd()
    path = _resolve(str(config_path), base)
    problems: list[str] = []
    raw = _read_json(path, problems)
    if overrides and isinstance(raw, dict):
        raw = _apply_overrides(raw, overrides, problems)
    training = parse_training(raw, str(path), problems, base) if raw is not None else None
    datasets: list[DatasetConfig] = []
    # The dataset file is checked even when config.json has problems: report everything at once.
    backend_value = training.data_backend_config if training else _raw_option(raw, "data_backend_config")
    if isinstance(backend_value, str):
        backend_path = _resolve(backend_value, base)
        raw_datasets = _read_json(backend_path, problems)
        if raw_datasets is not None:
            datasets = with_references(
                parse_datasets(raw_datasets, str(backend_path), training, base, problems),
                raw_datasets, training, str(backend_path), problems)
    if training is not None and training.eval_steps_interval and not any(
            ds.dataset_type == "eval" for ds in datasets):
        problems.append(f"{path}: key 'eval_steps_interval' needs a dataset with "
                        "'dataset_type': 'eval' in the dataset file")
    if training is not None:
        check_edit_validation(training, datasets, str(path), problems)
    log_level = _log_level(training, problems) if training is not None else None
    if problems:
        raise ConfigError(problems)
    assert training is not None
    training.output_dir = str(_resolve(training.output_dir, base).resolve())
    if training.group_offload_to_disk_path is not None:  # every rank: the same folder
        training.group_offload_to_disk_path = str(
            _resolve(training.group_offload_to_disk_path, base).resolve())
    training.log_level = log_level
    return Configuration(config_path=path, training=training, datasets=datasets)
