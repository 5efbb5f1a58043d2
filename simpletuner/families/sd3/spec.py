"""Stable Diffusion 3: CLIP-L, CLIP-G and T5, a flow-matching transformer."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

SPEC = FamilySpec(
    name="sd3", objective=FLOW, adapter="simpletuner.families.sd3.adapter.SD3Adapter",
    pipeline_prefixes=(("StableDiffusion3", "sd3"),), comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-sd3": "simpletuner.families.sd3.tiny.build_sd3"},
    skip_layer_guidance=True,
    swappable_block_keys=("num_layers",))
