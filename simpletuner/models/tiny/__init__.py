"""The built-in tiny models' shared parts (tokenizers, encoders, VAEs, the tiny UNet); each
family's tiny.py holds its recipes and its spec names them (`builtin:tiny-<family>`), so naming
a built-in model (model_path.py, used by `check`) imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from simpletuner.families import builtin_recipes, load_object


def recipe(name: str) -> Callable[[Path], object]:
    """The build function of built-in model ``name``, taking the staging folder and returning
    a pipeline."""
    return load_object(builtin_recipes()[name])
