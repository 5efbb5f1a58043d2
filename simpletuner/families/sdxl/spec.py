"""SDXL: two CLIP text encoders, a UNet predicting noise with micro-conditioning; controlnet
trains a ControlNetModel beside it (controlnet.py)."""

from simpletuner.families.spec import NOISE, FamilySpec
from simpletuner.training.adapters.lora_layouts import KOHYA

SPEC = FamilySpec(
    name="sdxl", objective=NOISE, adapter="simpletuner.families.sdxl.adapter.SDXLAdapter",
    pipeline_prefixes=(("StableDiffusionXL", "sdxl"),), comfyui_layout=KOHYA,
    tiny_models={"tiny-sdxl": "simpletuner.families.sdxl.tiny.build_sdxl"},
    guidance_rescale=True,
    controlnet_adapter="simpletuner.families.sdxl.controlnet.SDXLControlNetAdapter")
