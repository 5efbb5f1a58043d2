"""SANA-Video (Efficient-Large-Model/SANA-Video_2B_480p_diffusers): Sana's linear-attention
transformer over video latents of Wan 2.1's VAE, a Gemma2 text encoder; a video family."""

from simpletuner.families.frame_rule import FrameRule
from simpletuner.families.sanavideo.flavours import unsupported_folder
from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

HERE = "simpletuner.families.sanavideo."

SPEC = FamilySpec(
    name="sanavideo", objective=FLOW, adapter=HERE + "adapter.SanaVideoAdapter",
    pipeline_prefixes=(("SanaVideo", "sanavideo"),),
    # diffusers' Sana loader reads transformer. keys without alpha exactly.
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-sanavideo": HERE + "tiny.build_sanavideo"},
    folder_problem=unsupported_folder,
    # Wan 2.1's VAE compresses time 4x and keeps the first frame on its own: 4n+1 frames.
    frame_rule=FrameRule(multiple=4, remainder=1),
    swappable_block_keys=("num_layers",),
    simpletuner_keys={"sana_complex_human_instruction": (
        "remove it; captions are read with SanaVideoPipeline's own default instruction, as its "
        "validation and the exported pipeline read prompts")})
