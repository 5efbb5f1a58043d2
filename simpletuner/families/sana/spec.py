"""Sana (Efficient-Large-Model): a Gemma2 text encoder, the deep-compression autoencoder
(AutoencoderDC) and a linear-attention flow transformer."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

SPEC = FamilySpec(
    name="sana", objective=FLOW,
    adapter="simpletuner.families.sana.adapter.SanaAdapter",
    # Sana-Sprint (distilled, a guidance input) and SANA-Video are other models.
    pipeline_prefixes=(("SanaSprint", "sana_sprint"), ("SanaVideo", "sanavideo"),
                       ("Sana", "sana")),
    # diffusers reads transformer. keys without alpha exactly, as for SD3.
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-sana": "simpletuner.families.sana.tiny.build_sana"},
    simpletuner_keys={"sana_complex_human_instruction": (
        "remove it; captions are read with SanaPipeline's own default instruction, as its "
        "validation and the exported pipeline read prompts")})
