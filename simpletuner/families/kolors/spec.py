"""Kolors (Kwai-Kolors): SDXL's UNet and micro-conditioning with a ChatGLM3 text encoder, its
hidden states projected to the cross-attention width inside the UNet (text_proj)."""

from simpletuner.families.spec import NOISE, FamilySpec
from simpletuner.training.adapters.lora_layouts import KOHYA

SPEC = FamilySpec(
    name="kolors", objective=NOISE, adapter="simpletuner.families.kolors.adapter.KolorsAdapter",
    pipeline_prefixes=(("Kolors", "kolors"),),
    # The UNet is SDXL's architecture: kohya's lora_unet_ names, as for SDXL.
    comfyui_layout=KOHYA,
    tiny_models={"tiny-kolors": "simpletuner.families.kolors.tiny.build_kolors"},
    guidance_rescale=False)
