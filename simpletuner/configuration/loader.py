"""Load and validate config.json and multidatabackend.json, reporting every problem at once."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import ConfigError
from simpletuner.configuration.fields import parse_fields
from simpletuner.configuration.options import FLOW_FAMILIES, TrainingConfig

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SUPPORTED_BACKENDS = ("local",)


@dataclass
class Configuration:
    """Everything a run is configured by: training options plus the enabled datasets."""

    config_path: Path
    training: TrainingConfig
    datasets: list[DatasetConfig]


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


def _check_loss_options_fit_the_family(values: dict[str, Any], where: str,
                                       problems: list[str]) -> None:
    """An option the chosen family would ignore is a mistake to report, not to drop silently."""
    family = values.get("model_family")
    if family is None:
        return
    if family in FLOW_FAMILIES and values.get("snr_gamma") is not None:
        problems.append(
            f"{where}: key 'snr_gamma' applies to the noise-prediction families (sd1x, sd2x, "
            f"sdxl); model_family '{family}' trains with flow matching, where Min-SNR weighting "
            "does not exist. Remove it (flow_timestep_sampling and flow_shift shape that loss).")
    flow_keys = sorted(key for key in values if key.startswith("flow_"))
    if family not in FLOW_FAMILIES and flow_keys:
        problems.append(
            f"{where}: {', '.join(repr(k) for k in flow_keys)} apply to the flow-matching "
            f"families (sd3, flux); model_family '{family}' would ignore them. Remove them.")
    if family != "flux" and "flux_guidance_value" in values:
        problems.append(f"{where}: key 'flux_guidance_value' applies to model_family 'flux' "
                        f"only; '{family}' has no guidance input. Remove it.")


def _check_fsdp_options(values: dict[str, Any], where: str, problems: list[str]) -> None:
    if not values.get("fsdp_enable", False):
        return
    if values.get("fsdp_version", 2) != 2:
        problems.append(f"{where}: fsdp_version {values['fsdp_version']} is not supported; "
                        "use fsdp_version 2 (torch's fully_shard), the only FSDP here")
    if values.get("mixed_precision") == "fp16":
        problems.append(f"{where}: fsdp_enable needs mixed_precision 'bf16' or 'no'; fp16's loss "
                        "scaler does not handle sharded gradients")


def parse_training(raw: Any, where: str, problems: list[str]) -> TrainingConfig | None:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a JSON object of options, found {type(raw).__name__}")
        return None
    before = len(problems)
    values = parse_fields(TrainingConfig, raw, where, problems)
    if values.get("resolution_type", "pixel") == "pixel" and "resolution" in values:
        if not float(values["resolution"]).is_integer():
            problems.append(f"{where}: key 'resolution' is {values['resolution']}; with "
                            "resolution_type 'pixel' it must be a whole number of pixels")
    _check_loss_options_fit_the_family(values, where, problems)
    _check_fsdp_options(values, where, problems)
    if len(problems) > before:
        return None
    return TrainingConfig(**values)


def _check_dataset(ds: DatasetConfig, where: str, base: Path, problems: list[str]) -> None:
    if not _SAFE_ID.match(ds.id):
        problems.append(f"{where}: key 'id' is {ds.id!r}; use letters, digits, '.', '_' or '-' "
                        "(it names cache files)")
    if ds.type not in SUPPORTED_BACKENDS:
        problems.append(f"{where}: key 'type' is {ds.type!r}: not supported yet "
                        f"(supported: {', '.join(SUPPORTED_BACKENDS)})")
    if ds.caption_strategy == "instanceprompt" and not ds.instance_prompt:
        problems.append(f"{where}: key 'instance_prompt' is required when caption_strategy "
                        "is 'instanceprompt'")
    low, high = ds.minimum_aspect_ratio, ds.maximum_aspect_ratio
    if low is not None and high is not None and low > high:
        problems.append(f"{where}: key 'minimum_aspect_ratio' ({low}) is larger than "
                        f"'maximum_aspect_ratio' ({high})")
    low, high = ds.minimum_image_size, ds.maximum_image_size
    if low is not None and high is not None and low > high:
        problems.append(f"{where}: key 'minimum_image_size' ({low}) is larger than "
                        f"'maximum_image_size' ({high})")
    # float(): an inherited default may be an int, which has no is_integer() before Python 3.12
    if (ds.resolution_type == "pixel" and ds.resolution is not None
            and not float(ds.resolution).is_integer()):
        problems.append(f"{where}: key 'resolution' is {ds.resolution}; with resolution_type "
                        "'pixel' it must be a whole number of pixels")
    if not ds.disabled:
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
    first_index: dict[str, int] = {}
    for index, item in enumerate(raw):
        label = f"{where}: dataset [{index}]"
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            label += f" (id '{item['id']}')"
        if not isinstance(item, dict):
            problems.append(f"{label}: expected a JSON object, found {type(item).__name__}")
            continue
        before = len(problems)
        values = parse_fields(DatasetConfig, item, label, problems)
        usable = len(problems) == before
        if "id" not in values or "instance_data_dir" not in values:
            if "instance_data_dir" in values and not values.get("disabled", False):
                _check_folder(values["instance_data_dir"], label, base, problems)
            continue
        # Checked even when other keys were wrong, so one run reports every problem.
        ds = DatasetConfig(**values)
        if ds.id in first_index:
            problems.append(f"{label}: key 'id': duplicate id '{ds.id}' "
                            f"(also dataset [{first_index[ds.id]}])")
            usable = False  # its other keys are still checked below
        else:
            first_index[ds.id] = index
        if training is not None:
            ds = replace(
                ds,
                resolution=ds.resolution if ds.resolution is not None else training.resolution,
                resolution_type=ds.resolution_type or training.resolution_type,
            )
        _check_dataset(ds, label, base, problems)
        if usable and not ds.disabled:
            ds = replace(ds, instance_data_dir=str(_resolve(ds.instance_data_dir, base).resolve()))
            datasets.append(ds)
    if isinstance(raw, list) and not datasets and not problems:
        problems.append(f"{where}: no enabled dataset; add one or set 'disabled': false")
    return datasets


def _raw_option(raw: Any, key: str) -> Any:
    if not isinstance(raw, dict):
        return None
    return raw.get(key, raw.get(f"--{key}"))


def load_configuration(config_path: str | os.PathLike, *, cwd: Path | None = None,
                       overrides: dict[str, Any] | None = None) -> Configuration:
    """Read both files; raise one ConfigError listing every problem found in either."""
    base = cwd or Path.cwd()
    path = _resolve(str(config_path), base)
    problems: list[str] = []
    raw = _read_json(path, problems)
    if raw is not None and overrides:
        raw = {**raw, **overrides} if isinstance(raw, dict) else raw
    training = parse_training(raw, str(path), problems) if raw is not None else None
    datasets: list[DatasetConfig] = []
    # The dataset file is checked even when config.json has problems: report everything at once.
    backend_value = training.data_backend_config if training else _raw_option(raw, "data_backend_config")
    if isinstance(backend_value, str):
        backend_path = _resolve(backend_value, base)
        raw_datasets = _read_json(backend_path, problems)
        if raw_datasets is not None:
            datasets = parse_datasets(raw_datasets, str(backend_path), training, base, problems)
    if problems:
        raise ConfigError(problems)
    assert training is not None
    training.output_dir = str(_resolve(training.output_dir, base).resolve())
    return Configuration(config_path=path, training=training, datasets=datasets)
