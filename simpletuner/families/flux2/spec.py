"""FLUX.2: dev (Mistral3 text encoder, guidance-distilled) and klein (Qwen3), one transformer
and VAE, told apart by model_index.json; with a model_flavour they train on edit pairs too, any
number of references per target (conditioning_data as a list)."""

from simpletuner.families.flux2.lora_layout import COMFYUI_LAYOUT
from simpletuner.families.spec import FLOW, FamilySpec

SPEC = FamilySpec(
    name="flux2", objective=FLOW, adapter="simpletuner.families.flux2.adapter.Flux2Adapter",
    pipeline_prefixes=(("Flux2", "flux2"),), comfyui_layout=COMFYUI_LAYOUT,
    tiny_models={"tiny-flux2": "simpletuner.families.flux2.tiny.build_flux2_klein"},
    variant_adapters={
        "Flux2KleinPipeline": "simpletuner.families.flux2.adapter.Flux2KleinAdapter"},
    # edit pairs: references after the image's tokens, as Flux2Pipeline's image argument
    reference_flavours={"dev": None, "klein-4b": None, "klein-9b": None},
    guidance_input=True,
    swappable_block_keys=("num_layers", "num_single_layers"),  # double, then single blocks
    refused_options={"validation_negative_prompt": (
        "the FLUX.2 pipelines take no negative prompt (klein's guidance uses the empty "
        "prompt). Remove it.")})
