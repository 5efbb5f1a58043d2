"""Which Wan folders are the supported flavour (Wan 2.1 text-to-video), decided without torch from
the folder's layout and model_index.json: ``check`` (run by ./train.sh before the launcher)
and the adapter's folder check both ask it, so an I2V or Wan 2.2 folder is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

SUPPORTED = ("only Wan 2.1 text-to-video is supported here (model_flavour t2v-480p-1.3b-2.1 or "
             "t2v-480p-14b-2.1: a WanPipeline folder with one transformer)")


def unsupported_flavour(folder: Path) -> str | None:
    """What makes ``folder`` a Wan flavour other than 2.1 T2V (I2V, VACE, the two-expert 2.2
    A14B, the 2.2 TI2V-5B with per-token timesteps), or None."""
    if (folder / "transformer_2").is_dir():
        return "it has transformer_2/ (a two-expert Wan 2.2 A14B model)"
    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # no model_index.json: the subfolder checks say what is missing
    name = index.get("_class_name", "")
    if name.startswith("Wan") and name != "WanPipeline":
        return f"its model_index.json names {name}"
    if index.get("expand_timesteps"):
        return "its model_index.json sets expand_timesteps (Wan 2.2 TI2V-5B)"
    if index.get("boundary_ratio") is not None:
        return "its model_index.json sets boundary_ratio (a two-expert Wan 2.2 model)"
    return None
