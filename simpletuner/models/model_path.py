"""Whether ``pretrained_model_name_or_path`` names a model, decided without torch: ``check``
(run by ./train.sh before the launcher) reports a wrong path alone, not inside the launcher's
traceback. builtin.py builds the built-in models; layout.py checks a folder's subfolders."""

from __future__ import annotations

import os
from pathlib import Path

from simpletuner.families import builtin_recipes, family_names, family_spec

BUILTIN_PREFIX = "builtin:"
BUILTIN_NAMES = tuple(builtin_recipes())


def cache_root() -> Path:
    """$SIMPLETUNER_CACHE, else the user's cache directory (XDG) / simpletuner."""
    configured = os.environ.get("SIMPLETUNER_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "simpletuner"


def builtin_folder(name: str) -> Path:
    """Where built-in model ``name`` is built (builtin.py builds it there)."""
    return cache_root() / "builtin" / name


def known_builtins() -> str:
    return ", ".join(BUILTIN_PREFIX + name for name in BUILTIN_NAMES)


def family_folder_problem(model_family: str, name_or_path: str) -> str | None:
    """Why a local folder is a variant of ``model_family`` that is not supported (Wan's VACE and
    Wan 2.2 I2V flavours), as the family's spec decides it without torch; None otherwise."""
    if model_family not in family_names() or name_or_path.startswith(BUILTIN_PREFIX):
        return None
    problem = family_spec(model_family).folder_problem
    return None if problem is None else problem(name_or_path)


def model_path_problem(name_or_path: str) -> str | None:
    """Why ``name_or_path`` is neither a built-in model nor a local folder; None if it is one."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        name = name_or_path[len(BUILTIN_PREFIX):]
        if name in BUILTIN_NAMES:
            return None
        return f"unknown built-in model '{BUILTIN_PREFIX}{name}'; known: {known_builtins()}"
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return None
    if path.exists():
        return (f"pretrained_model_name_or_path {name_or_path!r} is a file; it must be a "
                "diffusers model folder (with model_index.json)")
    return (f"pretrained_model_name_or_path {name_or_path!r} is not a local folder. Models load "
            "from local folders only; nothing is downloaded. Download it yourself (for example "
            "`huggingface-cli download ID --local-dir DIR`) and give that folder, or use a "
            f"built-in model: {known_builtins()}")
