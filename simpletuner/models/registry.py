"""model_family -> adapter class. Adapters are imported only when asked for, so choosing one
family never imports another's dependencies. A new family is one line here."""

from __future__ import annotations

from importlib import import_module

from simpletuner.models.base import ModelAdapter

ADAPTERS = {
    "sd1x": ("simpletuner.models.sd1x", "SD1xAdapter"),
    "sd2x": ("simpletuner.models.sd2x", "SD2xAdapter"),
    "sdxl": ("simpletuner.models.sdxl", "SDXLAdapter"),
    "sd3": ("simpletuner.models.sd3", "SD3Adapter"),
    "flux": ("simpletuner.models.flux", "FluxAdapter"),
    "chroma": ("simpletuner.models.chroma", "ChromaAdapter"),
    "qwen_image": ("simpletuner.models.qwen_image", "QwenImageAdapter"),
    "z_image": ("simpletuner.models.z_image", "ZImageAdapter"),
    "flux2": ("simpletuner.models.flux2", "Flux2Adapter"),
    "wan": ("simpletuner.models.wan", "WanAdapter"),
}


def get_adapter_class(model_family: str) -> type[ModelAdapter]:
    if model_family not in ADAPTERS:
        raise ValueError(f"model_family {model_family!r} has no adapter; known: "
                         + ", ".join(ADAPTERS))
    module_name, class_name = ADAPTERS[model_family]
    return getattr(import_module(module_name), class_name)
