"""Stable Diffusion 2.x: SD 1.x's layout and objective (epsilon or v, from the scheduler)."""

from simpletuner.families.spec import NOISE, FamilySpec
from simpletuner.training.adapters.lora_layouts import KOHYA

SPEC = FamilySpec(
    name="sd2x", objective=NOISE, adapter="simpletuner.families.sd2x.adapter.SD2xAdapter",
    # 1.x and 2.x folders name the same pipeline
    pipeline_prefixes=(("StableDiffusion", "sd1x or sd2x"),), comfyui_layout=KOHYA,
    tiny_models={"tiny-sd2x": "simpletuner.families.sd2x.tiny.build_sd2x"},
    guidance_rescale=True)
