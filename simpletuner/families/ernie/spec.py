"""ERNIE-Image (Baidu): a Mistral3 text encoder's second-to-last hidden states and a
single-stream flow transformer on FLUX.2 VAE latents, patchified 2x2 and batch-norm
normalised."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import DIFFUSION_MODEL

SPEC = FamilySpec(
    name="ernie", objective=FLOW,
    adapter="simpletuner.families.ernie.adapter.ErnieImageAdapter",
    pipeline_prefixes=(("ErnieImage", "ernie"),), comfyui_layout=DIFFUSION_MODEL,
    tiny_models={"tiny-ernie": "simpletuner.families.ernie.tiny.build_ernie"})
