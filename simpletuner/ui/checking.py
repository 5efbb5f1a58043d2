"""The one seam between the UI and configuration checking: a configuration given as plain data
is written as the run's two files and loaded as ./train.sh's check loads them, each problem
returned as a record ``{"file", "path", "key", "message", "fix"}`` whose ``path`` is the JSON
path of the value (``learning_rate``, ``datasets[1].repeats``; "" when it names none), so the
page can show it at its field."""

from __future__ import annotations

from pathlib import Path

from simpletuner.common.atomic import atomic_write_json
from simpletuner.configuration import ConfigError
from simpletuner.configuration.loader import load_configuration
from simpletuner.training.run.launch_checks import launch_problems

CONFIG_NAME = "config.json"
DATASETS_NAME = "multidatabackend.json"


def problems_of(config: dict, datasets: list, folder: Path) -> list[dict]:
    """Write config.json (its data_backend_config and output_dir pointed at ``folder``'s own
    files) and multidatabackend.json into ``folder``; the problems check would report."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {**config, "data_backend_config": str(folder / DATASETS_NAME),
              "output_dir": str(folder / "output")}
    atomic_write_json(folder / DATASETS_NAME, datasets, indent=2)
    atomic_write_json(folder / CONFIG_NAME, config, indent=2)
    try:
        configuration = load_configuration(folder / CONFIG_NAME, cwd=folder)
        problems = launch_problems(configuration)
    except ConfigError as exc:
        problems = exc.records
    # The form shows the file by name: the run folder the UI wrote them into is no news.
    return [{**problem.as_json(), "file": Path(problem.file).name} for problem in problems]
