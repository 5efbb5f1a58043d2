"""Which HunyuanVideo folders are which flavour, decided without torch from model_index.json:
HunyuanVideo15Pipeline (text-to-video) or HunyuanVideo15ImageToVideoPipeline (image-to-video),
and whether ``model_flavour`` (SimpleTuner's names) names the folder's kind. HunyuanVideo 1.0
(HunyuanVideoPipeline) is another model, refused by name."""

from __future__ import annotations

from pathlib import Path

from simpletuner.models.model_index import read_model_index

T2V_PIPELINE, I2V_PIPELINE = "HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"
KINDS = {"t2v": f"a HunyuanVideo 1.5 text-to-video model ({T2V_PIPELINE})",
         "i2v": f"a HunyuanVideo 1.5 image-to-video model ({I2V_PIPELINE})"}
# SimpleTuner's model_flavour names -> the kind of folder they name.
FLAVOUR_KINDS = {"t2v-480p": "t2v", "t2v-720p": "t2v", "t2v-480p-distilled": "t2v",
                 "i2v-480p": "i2v", "i2v-720p": "i2v", "i2v-480p-distilled": "i2v",
                 "i2v-720p-distilled": "i2v"}


def folder_kind(folder: Path) -> str:
    """The folder's key in KINDS."""
    return "i2v" if read_model_index(folder).get("_class_name") == I2V_PIPELINE else "t2v"


def unsupported_folder(name_or_path: str) -> str | None:
    """Why the local folder ``name_or_path`` is a HunyuanVideo model not supported here (1.0's
    HunyuanVideoPipeline and its image-to-video or framepack pipelines); None when it is."""
    name = read_model_index(Path(name_or_path).expanduser()).get("_class_name", "")
    if name.startswith("HunyuanVideo") and name not in (T2V_PIPELINE, I2V_PIPELINE):
        return (f"{name_or_path} is not a HunyuanVideo 1.5 folder: its model_index.json names "
                f"{name}; supported here: {T2V_PIPELINE} and {I2V_PIPELINE} folders "
                "(hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-*)")
    return None


def flavour_mismatch(folder: Path, flavour: str | None) -> str | None:
    """Why ``flavour`` does not name ``folder``'s kind; None if it does or is not set."""
    if flavour is None:
        return None
    if flavour not in FLAVOUR_KINDS:
        return (f"{flavour!r} is not a HunyuanVideo flavour; use one of "
                f"{', '.join(FLAVOUR_KINDS)}, or remove it (the folder decides)")
    kind, expected = folder_kind(folder), FLAVOUR_KINDS[flavour]
    if kind == expected:
        return None
    return (f"{flavour!r} is {KINDS[expected]}, but {folder} is {KINDS[kind]}; set "
            "model_flavour to match the folder, or remove it")
