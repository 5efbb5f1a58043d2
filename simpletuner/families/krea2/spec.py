"""Krea 2: a Qwen3-VL text encoder tapped at several layers and a single-stream flow
transformer on Qwen-Image VAE latents packed 2x2."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import DIFFUSION_MODEL

SPEC = FamilySpec(
    name="krea2", objective=FLOW,
    adapter="simpletuner.families.krea2.adapter.Krea2Adapter",
    pipeline_prefixes=(("Krea2", "krea2"),), comfyui_layout=DIFFUSION_MODEL,
    # Krea2Pipeline guides whenever guidance_scale > 0 (cond + scale * (cond - uncond)).
    guidance_scale_without_cfg=0.0,
    tiny_models={"tiny-krea2": "simpletuner.families.krea2.tiny.build_krea2"})
