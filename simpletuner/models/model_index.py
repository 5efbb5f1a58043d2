"""A model folder's model_index.json, read without torch: the pipeline class it names decides
which family and which variant of it the folder is."""

from __future__ import annotations

import json
from pathlib import Path


def read_model_index(folder: Path) -> dict:
    """model_index.json's contents; {} without a readable one (the subfolder checks say what
    is missing)."""
    try:
        index = json.loads((Path(folder) / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def pipeline_class_name(folder: Path) -> str | None:
    """model_index.json's _class_name, None when the folder has none."""
    return read_model_index(folder).get("_class_name")
