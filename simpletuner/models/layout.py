"""Checks that a local folder is a diffusers model of the configured family, before loading,
so a mismatch reads as "this is an SDXL folder, set model_family to sdxl" and not as a
traceback from deep inside from_pretrained."""

from __future__ import annotations

import json
from pathlib import Path

from simpletuner.models.base import ModelFolderError

# model_index.json "_class_name" prefixes, most specific first, and the family each implies.
_PIPELINE_FAMILIES = (
    ("StableDiffusionXL", "sdxl"),
    ("StableDiffusion3", "sd3"),
    ("Flux2", "flux2"),
    ("Chroma", "chroma"),
    ("Flux", "flux"),
    ("QwenImage", "qwen_image"),
    ("ZImageOmni", "z_image_omni"),
    ("ZImage", "z_image"),
    ("Wan", "wan"),
    ("StableDiffusion", "sd1x or sd2x"),
)


def guess_family(folder: Path) -> str | None:
    """The family a folder's model_index.json names, if it names one we know."""
    index = folder / "model_index.json"
    try:
        class_name = json.loads(index.read_text(encoding="utf-8")).get("_class_name", "")
    except (OSError, ValueError):
        return None
    for prefix, family in _PIPELINE_FAMILIES:
        if class_name.startswith(prefix):
            return family
    return None


def check_model_folder(folder: Path, family: str, required: tuple[str, ...],
                       forbidden: tuple[str, ...] = ()) -> None:
    """Raise ModelFolderError unless every ``required`` subfolder exists and no ``forbidden``
    one does (a subfolder that marks another family, such as SDXL's text_encoder_2/)."""
    missing = [name for name in required if not (folder / name).is_dir()]
    unexpected = [name for name in forbidden if (folder / name).is_dir()]
    guessed = guess_family(folder)
    # Some families have the same subfolders (Z-Image, Qwen-Image): the index tells them apart.
    other_family = guessed is not None and family not in guessed.split(" or ")
    if not missing and not unexpected and not other_family:
        return
    problems = []
    if missing:
        problems.append("missing " + ", ".join(f"{name}/" for name in missing))
    if unexpected:
        problems.append("has " + ", ".join(f"{name}/" for name in unexpected))
    message = (f"{folder} is not a {family} model folder "
               f"({'; '.join(problems) or 'its model_index.json names another pipeline'}). "
               f"model_family {family} expects a diffusers folder with "
               + ", ".join(f"{name}/" for name in required) + ".")
    if other_family:
        message += f" Its model_index.json says it is {guessed}: set model_family to match."
    raise ModelFolderError(message)
