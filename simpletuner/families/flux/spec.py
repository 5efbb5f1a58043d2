"""FLUX.1: CLIP and T5, a guidance-distilled flow transformer; model_flavour 'kontext' trains a
FluxKontextPipeline folder on edit pairs (kontext.py)."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER

SPEC = FamilySpec(
    name="flux", objective=FLOW, adapter="simpletuner.families.flux.adapter.FluxAdapter",
    pipeline_prefixes=(("Flux", "flux"),), comfyui_layout=TRANSFORMER,
    tiny_models={"tiny-flux": "simpletuner.families.flux.tiny.build_flux",
                 "tiny-flux-kontext": "simpletuner.families.flux.tiny.build_flux_kontext"},
    variant_adapters={
        "FluxKontextPipeline": "simpletuner.families.flux.kontext.FluxKontextAdapter"},
    reference_flavours={"kontext": None},
    guidance_input=True,
    # the double-stream blocks, then the single-stream ones
    swappable_block_keys=("num_layers", "num_single_layers"),
    token_routing=True,  # tread_config: adapter.py's token_layout
    # Flux's guidance is an input of the network, not an unconditional pass
    guidance_scale_without_cfg=None)
