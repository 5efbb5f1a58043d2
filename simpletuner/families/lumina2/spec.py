"""Lumina 2 (Lumina-Image-2.0): a Gemma2 text encoder and a flow transformer that predicts
latents - noise at timestep 1 - sigma."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

SPEC = FamilySpec(
    name="lumina2", objective=FLOW,
    adapter="simpletuner.families.lumina2.adapter.Lumina2Adapter",
    pipeline_prefixes=(("Lumina2", "lumina2"),),
    # diffusers' converter of Lumina's own layout needs the real model's fused q/k/v sizes and
    # every module; its transformer. keys without alpha load exactly, as SD3's do.
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-lumina2": "simpletuner.families.lumina2.tiny.build_lumina2"},
    # the caption refiner, the image refiner (num_refiner_layers each), the joint blocks
    swappable_block_keys=("num_refiner_layers", "num_refiner_layers", "num_layers"))
