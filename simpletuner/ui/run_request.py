"""A run or check request's body (`{"name", "config": {...}, "datasets": [...]}`) read and its
local paths confined: each path option is resolved from the workspace (symlinks too), refused
outside the workspace and its dataset roots, and written absolute, so the run reads exactly
the folders the UI allowed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from simpletuner.ui.workspace import PathRefused, Workspace

# config.json options naming local files or folders ("latest" and Hub ids are not paths).
CONFIG_PATH_KEYS = ("lycoris_config", "user_prompt_library", "group_offload_to_disk_path",
                    "init_lora", "optimizer_config", "resume_from_checkpoint",
                    "pretrained_model_name_or_path")
DATASET_PATH_KEYS = ("instance_data_dir", "cache_dir_vae", "cache_dir")
NOT_PATHS = ("latest", "")
CHECKPOINT_NAME = re.compile(r"^checkpoint-\d+$")
MAX_NAME = 200


class BadRequest(ValueError):
    """The body is not what the API takes: problems as records, answered with 422."""

    def __init__(self, problems: list[dict]):
        super().__init__("; ".join(problem["message"] for problem in problems))
        self.problems = problems


@dataclass(frozen=True)
class RunRequest:
    name: str
    config: dict
    datasets: list


def read_request(body, workspace: Workspace, *, named: bool) -> RunRequest:
    """``body`` (parsed JSON) checked for shape, its paths confined; BadRequest otherwise."""
    if not isinstance(body, dict):
        raise BadRequest([{"message": "the body must be a JSON object"}])
    name, config, datasets = body.get("name", ""), body.get("config"), body.get("datasets")
    problems = []
    if named and not (isinstance(name, str) and 0 < len(name.strip()) <= MAX_NAME):
        problems.append({"key": "name", "message": f"'name': 1 to {MAX_NAME} characters"})
    if not isinstance(config, dict):
        problems.append({"key": "config", "message": "'config' must be a JSON object"})
    if not isinstance(datasets, list) or not all(isinstance(ds, dict) for ds in datasets):
        problems.append({"key": "datasets", "message": "'datasets' must be a list of objects"})
    if problems:
        raise BadRequest(problems)
    config = _confined(config, CONFIG_PATH_KEYS, "config.json", workspace, problems, "")
    datasets = [_confined_dataset(ds, i, workspace, problems) for i, ds in enumerate(datasets)]
    if problems:
        raise BadRequest(problems)
    return RunRequest(name.strip() if isinstance(name, str) else "", config, datasets)


def _confined_dataset(dataset: dict, index: int, workspace: Workspace,
                      problems: list[dict]) -> dict:
    where = f"multidatabackend.json[{index}]"
    dataset = _confined(dataset, DATASET_PATH_KEYS, where, workspace, problems,
                        f"datasets[{index}].")
    if isinstance(dataset.get("parquet"), dict):
        dataset["parquet"] = _confined(dataset["parquet"], ("path",), f"{where}.parquet",
                                       workspace, problems, f"datasets[{index}].parquet.")
    return dataset


def _confined(values: dict, keys: tuple[str, ...], where: str, workspace: Workspace,
              problems: list[dict], path_prefix: str) -> dict:
    """``values`` with each path option under ``keys`` confined; a refusal is a problem at
    the JSON path ``path_prefix + key``."""
    values = dict(values)
    for key in keys:
        value = values.get(key)
        if not isinstance(value, str) or value in NOT_PATHS or _names_no_local_path(key, value):
            continue
        try:
            values[key] = str(workspace.confine(value))
        except PathRefused as exc:
            problems.append({"file": where, "path": path_prefix + key, "key": key,
                             "message": f"{where}: key {key!r}: {exc}", "fix": ""})
    return values


def _names_no_local_path(key: str, value: str) -> bool:
    """A built-in model or a Hub id ('org/name') is not a folder; nor is a checkpoint's bare
    name, which the trainer looks up in the run's own output_dir."""
    if key == "resume_from_checkpoint":
        return CHECKPOINT_NAME.match(value) is not None
    if key != "pretrained_model_name_or_path":
        return False
    return value.startswith("builtin:") or not value.startswith(("/", ".", "~"))
