"""Which Wan folders are a supported flavour (Wan 2.1 text-to-video and image-to-video), decided
without torch from the folder's layout and model_index.json: ``check`` (run by ./train.sh before
the launcher) and the adapter's folder check both ask it, so a Wan 2.2 folder is refused by
name; and whether ``model_flavour`` names the folder's kind."""

from __future__ import annotations

import json
from pathlib import Path

T2V_PIPELINE, I2V_PIPELINE = "WanPipeline", "WanImageToVideoPipeline"
# SimpleTuner's Wan 2.1 model_flavour names -> the pipeline their folders hold.
FLAVOUR_PIPELINES = {"t2v-480p-1.3b-2.1": T2V_PIPELINE, "t2v-480p-14b-2.1": T2V_PIPELINE,
                     "i2v-480p-14b-2.1": I2V_PIPELINE, "i2v-720p-14b-2.1": I2V_PIPELINE}
SUPPORTED = ("only Wan 2.1 is supported here: text-to-video (a WanPipeline folder, model_flavour "
             "t2v-480p-1.3b-2.1 or t2v-480p-14b-2.1) and image-to-video (a "
             "WanImageToVideoPipeline folder with image_encoder/, i2v-480p-14b-2.1 or "
             "i2v-720p-14b-2.1), each with one transformer")


def pipeline_name(folder: Path) -> str | None:
    """model_index.json's _class_name; None without a readable model_index.json."""
    return _model_index(folder).get("_class_name")


def _model_index(folder: Path) -> dict:
    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no model_index.json: the subfolder checks say what is missing
    return index if isinstance(index, dict) else {}


def unsupported_flavour(folder: Path) -> str | None:
    """What makes ``folder`` a Wan flavour other than 2.1 T2V or I2V (VACE, the two-expert 2.2
    A14B, the 2.2 TI2V-5B with per-token timesteps), or None."""
    if (folder / "transformer_2").is_dir():
        return "it has transformer_2/ (a two-expert Wan 2.2 A14B model)"
    index = _model_index(folder)
    name = index.get("_class_name", "")
    if name.startswith("Wan") and name not in (T2V_PIPELINE, I2V_PIPELINE):
        return f"its model_index.json names {name}"
    if index.get("expand_timesteps"):
        return "its model_index.json sets expand_timesteps (Wan 2.2 TI2V-5B)"
    if index.get("boundary_ratio") is not None:
        return "its model_index.json sets boundary_ratio (a two-expert Wan 2.2 model)"
    if name == I2V_PIPELINE and not (folder / "image_encoder").is_dir():
        return "it is an image-to-video folder without image_encoder/ (Wan 2.2 I2V)"
    return None


def flavour_mismatch(folder: Path, flavour: str | None) -> str | None:
    """Why ``flavour`` does not name ``folder``'s kind of Wan 2.1 model; None if it does or
    is not set (the folder decides)."""
    if flavour is None:
        return None
    if flavour not in FLAVOUR_PIPELINES:
        return (f"{flavour!r} is not a supported Wan flavour; use one of "
                f"{', '.join(FLAVOUR_PIPELINES)}, or remove it (the folder decides)")
    expected, found = FLAVOUR_PIPELINES[flavour], pipeline_name(folder) or T2V_PIPELINE
    if found == expected:
        return None
    return (f"{flavour!r} is a {expected} model, but the model_index.json of {folder} names "
            f"{found}; set model_flavour to match the folder, or remove it")
