"""Ideogram 4: Qwen3-VL hidden states of thirteen layers per token, a flow transformer on FLUX.2
VAE latents packed 2x2 after the text, and a second, unconditional transformer that the
pipeline's asymmetric guidance blends in (frozen as loaded here)."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import DIFFUSION_MODEL

SPEC = FamilySpec(
    name="ideogram", objective=FLOW,
    adapter="simpletuner.families.ideogram.adapter.IdeogramAdapter",
    pipeline_prefixes=(("Ideogram4", "ideogram"),), comfyui_layout=DIFFUSION_MODEL,
    refused_options={"validation_negative_prompt": (
        "Ideogram4Pipeline takes no negative prompt (its unconditional transformer reads no "
        "text). Remove it.")},
    tiny_models={"tiny-ideogram": "simpletuner.families.ideogram.tiny.build_ideogram"})
