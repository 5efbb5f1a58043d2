"""The recipes of the built-in tiny models (`builtin:tiny-<family>`), one module per kind of
network. This table is plain text, so naming a built-in model (model_path.py, used by `check`)
imports no torch; builtin.py imports a recipe only when it builds that model. A new built-in
model is one line here and its build function."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Callable

# name -> (module, build function taking the staging folder and returning a pipeline)
RECIPES = {
    "tiny-sd1x": ("simpletuner.models.tiny.unet_models", "build_sd1x"),
    "tiny-sd2x": ("simpletuner.models.tiny.unet_models", "build_sd2x"),
    "tiny-sdxl": ("simpletuner.models.tiny.unet_models", "build_sdxl"),
    "tiny-sd3": ("simpletuner.models.tiny.flow_models", "build_sd3"),
    "tiny-flux": ("simpletuner.models.tiny.flow_models", "build_flux"),
    "tiny-flux-kontext": ("simpletuner.models.tiny.flow_models", "build_flux_kontext"),
    "tiny-chroma": ("simpletuner.models.tiny.chroma_model", "build_chroma"),
    "tiny-qwen_image": ("simpletuner.models.tiny.qwen_models", "build_qwen_image"),
    "tiny-qwen_image-edit": ("simpletuner.models.tiny.qwen_models", "build_qwen_image_edit"),
    "tiny-qwen_image-edit-plus": ("simpletuner.models.tiny.qwen_models",
                                  "build_qwen_image_edit_plus"),
    "tiny-z_image": ("simpletuner.models.tiny.z_image", "build_z_image"),
    "tiny-flux2": ("simpletuner.models.tiny.flux2_models", "build_flux2_klein"),
    "tiny-wan": ("simpletuner.models.tiny.wan_model", "build_wan"),
    "tiny-wan-i2v": ("simpletuner.models.tiny.wan_model", "build_wan_i2v"),
    "tiny-wan22": ("simpletuner.models.tiny.wan22_model", "build_wan22"),
    "tiny-wan22-ti2v": ("simpletuner.models.tiny.wan22_model", "build_wan22_ti2v"),
}


def recipe(name: str) -> Callable[[Path], object]:
    module_name, function_name = RECIPES[name]
    return getattr(import_module(module_name), function_name)
