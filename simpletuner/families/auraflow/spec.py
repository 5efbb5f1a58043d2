"""AuraFlow (fal): a UMT5 text encoder, the SDXL VAE and an MMDiT flow transformer (joint
blocks, then single ones) that takes sigma as its timestep."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

SPEC = FamilySpec(
    name="auraflow", objective=FLOW,
    adapter="simpletuner.families.auraflow.adapter.AuraFlowAdapter",
    pipeline_prefixes=(("AuraFlow", "auraflow"),),
    # diffusers reads transformer. keys without alpha exactly, as for SD3.
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-auraflow": "simpletuner.families.auraflow.tiny.build_auraflow"})
