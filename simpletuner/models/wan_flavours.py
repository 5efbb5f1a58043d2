"""Which Wan folders are a supported flavour, decided without torch from the folder's layout and
model_index.json: Wan 2.1 text-to-video (one transformer), Wan 2.2 T2V-A14B (two experts,
transformer/ for high noise and transformer_2/ for low, split at boundary_ratio) and Wan 2.2
TI2V-5B (expand_timesteps) as text-to-video. ``check`` (run by ./train.sh before the launcher)
and the adapter's folder check both ask it, so an I2V folder is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

SUPPORTED = ("supported here: Wan 2.1 text-to-video (model_flavour t2v-480p-1.3b-2.1 or "
             "t2v-480p-14b-2.1: a WanPipeline folder with one transformer), Wan 2.2 T2V-A14B "
             "(model_flavour t2v-14b-2.2-high or t2v-14b-2.2-low: a WanPipeline folder with "
             "transformer_2/ and boundary_ratio) and Wan 2.2 TI2V-5B as text-to-video "
             "(model_flavour ti2v-5b-2.2: a WanPipeline folder with expand_timesteps)")
# model_flavour -> the A14B expert it trains, named after SimpleTuner's i2v-14b-2.2-high/-low.
EXPERT_FLAVOURS = {"t2v-14b-2.2-high": "high", "t2v-14b-2.2-low": "low"}


def model_index(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_two_expert(folder: Path) -> bool:
    """A Wan 2.2 A14B folder: transformer_2/ beside transformer/."""
    return (folder / "transformer_2").is_dir()


def wan22_layout(folder: Path) -> str | None:
    """"a14b" (two experts), "ti2v" (TI2V-5B: per-token timesteps) or None (Wan 2.1)."""
    if is_two_expert(folder):
        return "a14b"
    index = model_index(folder) or {}
    return "ti2v" if index.get("expand_timesteps") else None


def unsupported_flavour(folder: Path) -> str | None:
    """What makes ``folder`` a Wan flavour not supported here (I2V, VACE, a second expert with
    no boundary), or None."""
    index = model_index(folder)
    if index is None:
        return None  # no model_index.json: the subfolder checks say what is missing
    name = index.get("_class_name", "")
    if name.startswith("Wan") and name != "WanPipeline":
        return f"its model_index.json names {name}"
    has_boundary = index.get("boundary_ratio") is not None
    if is_two_expert(folder) and not has_boundary:
        return "it has transformer_2/ but its model_index.json sets no boundary_ratio"
    if has_boundary and not is_two_expert(folder):
        return "its model_index.json sets boundary_ratio but it has no transformer_2/"
    return None


def expert_flavour_problem(folder: Path, flavour: str | None) -> str | None:
    """A two-expert folder needs model_flavour to name the expert to train; a one-transformer
    folder must not name one."""
    if is_two_expert(folder):
        if flavour in EXPERT_FLAVOURS:
            return None
        return (f"{folder} is a two-expert Wan 2.2 A14B model; set model_flavour to "
                f"{' or '.join(EXPERT_FLAVOURS)} (the high- or low-noise expert to train)"
                + ("" if flavour is None else f", not {flavour!r}"))
    if flavour in EXPERT_FLAVOURS:
        return (f"{flavour!r} trains one expert of a Wan 2.2 A14B model, but {folder} has one "
                "transformer; use a folder with transformer_2/ (e.g. builtin:tiny-wan22), or "
                "remove model_flavour")
    return None


def boundary_ratio(folder: Path) -> float:
    return float(model_index(folder)["boundary_ratio"])
