"""Validate config.json's options and multidatabackend.json's datasets, given as files or as
plain data, reporting every problem at once (each a Problem record, errors.py)."""

from __future__ import annotations

import json
import math
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simpletuner.configuration.conditioning_checks import with_references
from simpletuner.configuration.dataset_file import (PIXEL_TYPES, dataset_file_location,
                                                    parse_datasets, resolve)
from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.edit_validation_checks import check_edit_validation
from simpletuner.configuration.errors import DATASETS, ConfigError, Location, Problem
from simpletuner.configuration.fields import normalise_key, parse_fields
from simpletuner.configuration.memory_checks import (check_block_swap_options,
                                                     check_group_offload_options)
from simpletuner.configuration.options import LogLevel, TrainingConfig
from simpletuner.configuration.simpletuner_keys.model import without_the_model_folder
from simpletuner.configuration.simpletuner_options import CONFIG_JSON
from simpletuner.configuration.speed_checks import (check_checkpointing_interval,
                                                    check_compile_options, check_tread_config)
from simpletuner.configuration.training_checks import (check_context_parallel_options,
                                                       check_controlnet_options,
                                                       check_fsdp_options,
                                                       check_lora_target_all,
                                                       check_loss_options_fit_the_family,
                                                       with_lora_target_preset)
from simpletuner.configuration.validation_options import check_validation_options
from simpletuner.dataset_kinds import kind_of

COMMAND_LINE = Location("command line")  # where overrides come from, in messages
LOG_LEVEL_ENV = "SIMPLETUNER_LOG_LEVEL"  # SimpleTuner's setting (config.env); log_level wins
# the environment variable's problem names no file in the text report
_ENVIRONMENT = Location("environment", LOG_LEVEL_ENV, shown="")


@dataclass
class Configuration:
    """Everything a run is configured by: training options plus the enabled datasets."""

    config_path: Path
    training: TrainingConfig
    datasets: list[DatasetConfig]   # trained or evaluated, in file order
    references: list[DatasetConfig] = field(default_factory=list)  # dataset_type conditioning
    # the dataset file's entries' ids in file order: problems found later name their index
    entry_ids: tuple[object, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self):  # reference images are paired with the datasets, never trained
        self.references += [ds for ds in self.datasets if kind_of(ds).is_reference]
        self.datasets = [ds for ds in self.datasets if not kind_of(ds).is_reference]

    @property
    def dataset_file(self) -> Location:
        """The dataset file, for the problems that checks after loading find in it."""
        return Location(self.training.data_backend_config, DATASETS, entry_ids=self.entry_ids)


def _read_json(path: Path, problems: list[Problem]) -> Any:
    where = Location(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(where.problem("", "file not found"))
        return None
    except OSError as exc:
        problems.append(where.problem("", f"cannot be read ({exc.strerror})"))
        return None
    repeated: list[str] = []
    try:
        value = json.loads(text, object_pairs_hook=lambda pairs: _object(pairs, repeated))
    except json.JSONDecodeError as exc:
        problems.append(where.problem(
            "", f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"))
        return None
    # json keeps the last of repeated keys silently, which would hide the first value.
    problems.extend(where.problem(key, f"key {key!r} appears more than once in one object; only "
                                  "the last would count") for key in dict.fromkeys(repeated))
    return value


def _object(pairs: list[tuple[str, Any]], repeated: list[str]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            repeated.append(key)
        seen[key] = value
    return seen


def parse_training(raw: Any, where: Location, problems: list[Problem],
                   base: Path) -> TrainingConfig | None:
    if not isinstance(raw, dict):
        problems.append(where.problem(
            "", f"expected a JSON object of options, found {type(raw).__name__}"))
        return None
    before = len(problems)
    values = parse_fields(TrainingConfig, with_lora_target_preset(without_the_model_folder(raw)),
                          where, problems, CONFIG_JSON)
    resolution_type = values.get("resolution_type", "pixel")
    if resolution_type in PIXEL_TYPES and "resolution" in values:
        if not float(values["resolution"]).is_integer():
            problems.append(where.problem(
                "resolution", f"key 'resolution' is {values['resolution']}; with resolution_type "
                f"'{resolution_type}' it must be a whole number of pixels"))
    check_loss_options_fit_the_family(values, where, problems)
    check_fsdp_options(values, where, problems)
    check_context_parallel_options(values, where, problems)
    check_block_swap_options(values, where, problems)
    check_checkpointing_interval(values, where, problems)
    check_compile_options(values, where, problems)
    check_tread_config(values, where, problems)
    check_group_offload_options(values, where, base, problems)
    check_lora_target_all(raw, values, where, problems)
    check_controlnet_options(values, where, base, problems)
    if len(problems) > before:
        return None
    training = TrainingConfig(**values)
    if training.lr_scheduler == "polynomial" and training.lr_end >= training.learning_rate:
        problems.append(where.problem(
            "lr_end", f"key 'lr_end' ({training.lr_end:g}) must be below learning_rate "
            f"({training.learning_rate:g}) for lr_scheduler 'polynomial'"))
        return None
    training = _with_validation_defaults(training, base)
    check_validation_options(training, where, problems)
    return None if len(problems) > before else training


def _with_validation_defaults(training: TrainingConfig, base: Path) -> TrainingConfig:
    """validation_resolution's default (the training side), and the prompt library's path
    from the working directory, as SimpleTuner reads it."""
    resolution, library = training.validation_resolution, training.user_prompt_library
    return replace(
        training,
        validation_resolution=training_side(training) if resolution is None else resolution,
        user_prompt_library=None if library is None else str(resolve(library, base)))


def training_side(training: TrainingConfig) -> int:
    """The side of a square at the training resolution, on the bucket alignment: what
    validation_resolution defaults to (area types: the square of that area)."""
    side = float(training.resolution)
    if training.resolution_type == "area":
        side = math.sqrt(side * 1_000_000)
    alignment = training.aspect_bucket_alignment
    return max(alignment, int(math.floor(side / alignment + 0.5)) * alignment)


def _raw_option(raw: Any, key: Location) -> Any:
    if not isinstance(raw, dict):
        return None
    return raw.get(key, raw.get(f"--{key}"))


def _apply_overrides(raw: dict, overrides: dict[str, Any], problems: list[Problem]) -> dict:
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


def _log_level(training: TrainingConfig, problems: list[Problem]) -> str | None:
    """config.json's log_level, else SimpleTuner's environment variable (any case), else INFO."""
    if training.log_level is not None:
        return training.log_level
    value = os.environ.get(LOG_LEVEL_ENV, "INFO")
    levels = typing.get_args(LogLevel)
    if value.upper() not in levels:
        problems.append(_ENVIRONMENT.problem(
            "", f"environment variable {LOG_LEVEL_ENV} is {value!r}",
            f"use one of {', '.join(levels)}, or set log_level in config.json"))
        return None
    return value.upper()


def _finished(training: TrainingConfig, log_level: str, base: Path) -> TrainingConfig:
    """The values the run uses: folders absolute and resolved (every rank: the same folder),
    the log level decided."""
    offload_path = training.group_offload_to_disk_path
    controlnet = training.controlnet_model_name_or_path
    return replace(
        training, output_dir=str(resolve(training.output_dir, base).resolve()),
        group_offload_to_disk_path=(None if offload_path is None
                                    else str(resolve(offload_path, base).resolve())),
        controlnet_model_name_or_path=(None if controlnet is None
                                       else str(resolve(controlnet, base).resolve())),
        log_level=log_level)


def _validated(raw: Any, path: Path, base: Path, problems: list[Problem],
               datasets_at: Callable[[Path], Any]) -> Configuration:
    """The Configuration from config.json's object ``raw``; ``datasets_at`` gives the dataset
    list the config names (None: unreadable, already reported). Raises one ConfigError listing
    ``problems`` and every problem found here."""
    where = Location(str(path))
    training = parse_training(raw, where, problems, base) if raw is not None else None
    datasets: list[DatasetConfig] = []
    entry_ids: tuple[object, ...] = ()
    # The dataset file is checked even when config.json has problems: report everything at once.
    backend_value = (training.data_backend_config if training
                     else _raw_option(raw, "data_backend_config"))
    if isinstance(backend_value, str):
        backend_path = resolve(backend_value, base)
        raw_datasets = datasets_at(backend_path)
        if raw_datasets is not None:
            listed = dataset_file_location(str(backend_path), raw_datasets)
            entry_ids = listed.entry_ids
            datasets = with_references(
                parse_datasets(raw_datasets, listed, training, base, problems),
                raw_datasets, training, listed, problems)
    if training is not None and training.eval_steps_interval and not any(
            kind_of(ds).evaluates for ds in datasets):
        problems.append(where.problem(
            "eval_steps_interval", "key 'eval_steps_interval' needs a dataset with "
            "'dataset_type': 'eval' in the dataset file"))
    if training is not None:
        check_edit_validation(training, datasets, where, problems)
    log_level = _log_level(training, problems) if training is not None else None
    if problems:
        raise ConfigError(problems)
    assert training is not None and log_level is not None
    return Configuration(config_path=path, training=_finished(training, log_level, base),
                         datasets=datasets, entry_ids=entry_ids)


def configuration_from_data(config: dict[str, Any], datasets: list[Any], *, base: Path,
                            config_path: str | os.PathLike = "config.json") -> Configuration:
    """The Configuration that config.json holding ``config`` and its dataset file holding
    ``datasets`` would give, validated by the same checks; relative paths are taken from
    ``base`` (the working directory of a run). ``config_path`` (from ``base``) names config.json
    in problems; the dataset file is named by the config's data_backend_config."""
    return _validated(config, resolve(str(config_path), base), base, [], lambda _: datasets)


def load_configuration(config_path: str | os.PathLike, *, cwd: Path | None = None,
                       overrides: dict[str, Any] | None = None) -> Configuration:
    """Read both files; raise one ConfigError listing every problem found in either.
    ``overrides`` are config.json options from the command line (see command_line.py)."""
    base = cwd or Path.cwd()
    path = resolve(str(config_path), base)
    problems: list[Problem] = []
    raw = _read_json(path, problems)
    if overrides and isinstance(raw, dict):
        raw = _apply_overrides(raw, overrides, problems)
    return _validated(raw, path, base, problems,
                      lambda backend_path: _read_json(backend_path, problems))
