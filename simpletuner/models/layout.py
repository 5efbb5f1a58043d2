"""Checks that a local folder is a diffusers model of the configured family, before loading,
so a mismatch reads as "this is an SDXL folder, set model_family to sdxl" and not as a
traceback from deep inside from_pretrained."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families import family_specs
from simpletuner.models.model_index import pipeline_class_name


class ModelFolderError(ValueError):
    """A model path that cannot be loaded as the configured family: says what was expected."""


def guess_family(folder: Path) -> str | None:
    """The family a folder's model_index.json names, if it names one we know: the longest
    matching _class_name prefix of any family's spec (StableDiffusionXL before
    StableDiffusion)."""
    class_name = pipeline_class_name(folder) or ""
    prefixes = sorted((pair for spec in family_specs() for pair in spec.pipeline_prefixes),
                      key=lambda pair: -len(pair[0]))
    return next((family for prefix, family in prefixes if class_name.startswith(prefix)), None)


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
