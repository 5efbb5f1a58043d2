"""The one seam between the UI and configuration checking: a configuration given as plain data
is written as the run's two files and loaded as ./train.sh's check loads them, each problem
returned as a record ``{"file", "path", "key", "message", "fix"}`` whose ``path`` is the JSON
path of the value (``learning_rate``, ``datasets[1].repeats``; "" when it names none), so the
page can show it at its field."""

from __future__ import annotations

import re
from pathlib import Path

from simpletuner.common.atomic import atomic_write_json
from simpletuner.configuration import ConfigError
from simpletuner.configuration.loader import load_configuration
from simpletuner.training.run.launch_checks import launch_problems

CONFIG_NAME = "config.json"
DATASETS_NAME = "multidatabackend.json"

# How the text report names where a problem is: "<file>: [dataset [i] (id 'x'): ][key 'k' ...]".
_WHERE = re.compile(r"^(?P<file>[^:]*?(?:config|multidatabackend)\.json): "
                    r"(?:dataset \[(?P<index>\d+)\][^:]*: )?(?:(?:missing required )?"
                    r"key '(?P<key>[^']+)')?")


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
        problems = exc.problems
    return [problem_record(problem) for problem in problems]


def problem_record(problem) -> dict:
    """A check's problem as a record: a Problem record as it is; a text one (the checks that
    still report text) read back from how the report names its place."""
    if hasattr(problem, "as_json"):
        return problem.as_json()
    text = str(problem)
    where = _WHERE.match(text)
    if where is None:
        return {"file": "", "path": "", "key": "", "message": text, "fix": ""}
    file, index, key = Path(where["file"]).name, where["index"], where["key"] or ""
    if index is None:
        path = key if file == CONFIG_NAME else ""
    else:
        path = f"datasets[{index}]" + (f".{key}" if key else "")
    return {"file": file, "path": path, "key": key, "message": text[where.end("file") + 2:],
            "fix": ""}
