"""A configuration given as plain data, written as the two files ./train.sh reads: the inverse
of load_configuration (loader.py) for data that configuration_from_data accepts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from simpletuner.common.atomic import atomic_write_json

CONFIG_FILE = "config.json"
DATASET_FILE = "multidatabackend.json"


def write_configuration_files(config: dict[str, Any], datasets: list[Any],
                              folder: str | os.PathLike) -> Path:
    """Write ``folder``/config.json (``config`` naming the dataset file written beside it) and
    ``folder``/multidatabackend.json; return config.json's path. Other relative paths stay as
    given: SimpleTuner reads them from the working directory, so loading the files from the
    ``base`` that configuration_from_data was given yields the same configuration."""
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    # dashed spellings ("--data_backend_config") name the same option: one key is written
    named = {key: value for key, value in config.items()
             if key.lstrip("-") != "data_backend_config"}
    atomic_write_json(folder / DATASET_FILE, datasets, indent=2)
    config_path = folder / CONFIG_FILE
    atomic_write_json(config_path, {**named, "data_backend_config": str(folder / DATASET_FILE)},
                      indent=2)
    return config_path
