"""Stable Diffusion 1.x: one CLIP text encoder, a UNet predicting noise."""

from simpletuner.families.spec import NOISE, FamilySpec
from simpletuner.training.adapters.lora_layouts import KOHYA

SPEC = FamilySpec(
    name="sd1x", objective=NOISE, adapter="simpletuner.families.sd1x.adapter.SD1xAdapter",
    # 1.x and 2.x folders name the same pipeline
    pipeline_prefixes=(("StableDiffusion", "sd1x or sd2x"),), comfyui_layout=KOHYA,
    tiny_models={"tiny-sd1x": "simpletuner.families.sd1x.tiny.build_sd1x"},
    guidance_rescale=True)
