"""How many blocks block swap can move (musubi_blocks_to_swap's most), read from a model
folder's trained network's config.json without torch: the family's spec names the config keys
that add up to its adapter's swappable_blocks, so ``check`` refuses a count that is too large
before anything loads; and its attention heads, which context_parallel_size must divide."""

from __future__ import annotations

import json
from pathlib import Path

from simpletuner.families import family_names, family_spec
from simpletuner.models.model_path import BUILTIN_PREFIX, builtin_folder

# The flow families' trained network (Wan 2.2's second expert, transformer_2, is the same
# architecture).
TRAINED_SUBFOLDER = "transformer"


def model_folder(name_or_path: str) -> Path | None:
    """The folder ``name_or_path`` names, if it holds a model now: a built-in model's once it
    is built in the cache, else the local path."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        folder = builtin_folder(name_or_path[len(BUILTIN_PREFIX):])
    else:
        folder = Path(name_or_path).expanduser()
    return folder if (folder / "model_index.json").is_file() else None


def _trained_config(name_or_path: str) -> dict | None:
    """The trained network's config.json in the model folder, if there is one now."""
    folder = model_folder(name_or_path)
    if folder is None:
        return None
    try:
        config = json.loads((folder / TRAINED_SUBFOLDER / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def attention_heads(model_family: str, name_or_path: str) -> int | None:
    """The attention heads of the model's trained network, where the family's spec names the
    key (context_parallel_size must divide them); None where not known before it loads."""
    if model_family not in family_names():
        return None
    key = family_spec(model_family).attention_heads_key
    config = _trained_config(name_or_path) if key else None
    try:
        return None if config is None else int(config[key])
    except (KeyError, TypeError, ValueError):
        return None


def swappable_block_count(model_family: str, name_or_path: str) -> int | None:
    """The number of blocks the family's adapter can swap in this model; None where that is
    not known before the network loads (a family whose spec names no keys, a built-in model
    not built yet, a config without them), and the run's own check decides."""
    if model_family not in family_names():
        return None
    keys = family_spec(model_family).swappable_block_keys
    config = _trained_config(name_or_path) if keys else None
    try:
        return None if config is None else sum(int(config[key]) for key in keys)
    except (KeyError, TypeError, ValueError):
        return None
