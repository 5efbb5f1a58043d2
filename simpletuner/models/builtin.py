"""Built-in tiny models (`builtin:tiny-sd1x` and friends): built locally from configs with a
fixed seed on first use, saved as complete diffusers folders in the cache, then loaded like any
local model. Nothing is ever downloaded."""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

import torch

from simpletuner.common.atomic import give_umask_modes, staging_folder
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.model_path import (
    BUILTIN_NAMES, BUILTIN_PREFIX, builtin_folder, known_builtins, model_path_problem,
)
from simpletuner.models.tiny import recipe

BUILD_SEED = 0
# Bumped when a recipe changes what it builds, so older cached builds are replaced, not reused.
# 2: SD 1.x/2.x/SDXL get a pretrained VAE and one-group norms in the UNet.
BUILTIN_VERSION = 2
VERSION_FILE = "simpletuner_builtin.json"
# A build is also tied to the libraries that made it: another version may initialise or save a
# model differently, and a folder one version wrote can misbehave when another loads it.
BUILD_LIBRARIES = ("torch", "diffusers", "transformers")


def _library_versions() -> dict[str, str]:
    return {name: version(name) for name in BUILD_LIBRARIES}


class UnknownBuiltinError(ModelFolderError):
    pass


def _unknown(name: str) -> UnknownBuiltinError:
    return UnknownBuiltinError(f"unknown built-in model '{BUILTIN_PREFIX}{name}'; known: "
                               f"{known_builtins()}")


def _is_current(folder: Path) -> bool:
    """A complete build made by this version of the recipes with these libraries."""
    try:
        marker = json.loads((folder / VERSION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return ((folder / "model_index.json").is_file() and marker.get("version") == BUILTIN_VERSION
            and marker.get("libraries") == _library_versions())


def _check_weights_written(staging: Path) -> None:
    """Every model component got its weights. transformers writes them only from rank 0 once a
    process group exists, so a build on another rank must never be installed."""
    empty = [p.parent.name for p in staging.glob("*/config.json")
             if not any(p.parent.glob("*.safetensors"))]
    if empty:
        raise ModelFolderError(
            f"building {staging.name} wrote no weights for {', '.join(sorted(empty))}; build "
            "built-in models from the main process (`python -m simpletuner builtin NAME`)")


def _install(staging: Path, final: Path) -> None:
    """Rename the finished build into place. When several processes build at once the first
    rename wins and the others keep the winner; an outdated build found there is moved aside
    (by whichever process gets to it) and replaced."""
    for _ in range(2):
        try:
            os.rename(staging, final)
            return
        except OSError:
            if _is_current(final):
                return
        outdated = final.with_name(f".{final.name}-outdated-{os.getpid()}")
        try:
            os.rename(final, outdated)
        except FileNotFoundError:
            pass  # another process moved it first
        shutil.rmtree(outdated, ignore_errors=True)
    raise ModelFolderError(f"cannot replace {final} with a new built-in model; delete it and retry")


def ensure_builtin_model(name: str) -> Path:
    """The folder of built-in model ``name`` (e.g. "tiny-sd1x"), building it on first use or
    when the cached build is from an older recipe version or other library versions.

    Built in a private temporary folder next to the target and renamed into place, so readers
    never see a partial model."""
    if name not in BUILTIN_NAMES:
        raise _unknown(name)
    final = builtin_folder(name)
    root = final.parent
    if _is_current(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_folder(root, f".{name}-")  # others sharing the cache can read it
    try:
        # A private RNG stream: the same weights every time, the caller's RNG state untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BUILD_SEED)
            pipeline = recipe(name)(staging)
        pipeline.save_pretrained(staging, safe_serialization=True)
        give_umask_modes(staging)
        _check_weights_written(staging)
        (staging / VERSION_FILE).write_text(
            json.dumps({"builtin": name, "version": BUILTIN_VERSION,
                        "libraries": _library_versions()}) + "\n", encoding="utf-8")
        _install(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def resolve_model_path(name_or_path: str) -> Path:
    """Map ``builtin:NAME`` to its built folder, or check that a local folder exists."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        return ensure_builtin_model(name_or_path[len(BUILTIN_PREFIX):])
    problem = model_path_problem(name_or_path)
    if problem:
        raise ModelFolderError(problem)
    return Path(name_or_path).expanduser().resolve()


def run_builtin_command(name: str) -> int:
    """`python -m simpletuner builtin NAME`: build if needed, print the folder last."""
    name = name.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_NAMES:
        print(_unknown(name), file=sys.stderr)
        return 2
    print(ensure_builtin_model(name))
    return 0
