"""Chroma: a pruned FLUX.1-schnell with T5 alone and real classifier-free guidance."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER

SPEC = FamilySpec(
    name="chroma", objective=FLOW, adapter="simpletuner.families.chroma.adapter.ChromaAdapter",
    pipeline_prefixes=(("Chroma", "chroma"),), comfyui_layout=TRANSFORMER,
    tiny_models={"tiny-chroma": "simpletuner.families.chroma.tiny.build_chroma"},
    swappable_block_keys=("num_layers", "num_single_layers"),  # double, then single blocks
    # flux_lora_target 'all' is accepted as the default targets, which for Chroma (as in
    # SimpleTuner) leave out the text-stream projections that SimpleTuner's 'all' adds.
    lora_target_all_problem=(
        "adapts more of Chroma than its default (to_q, to_k, to_v, to_out.0); set "
        'lora_target_modules to ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", '
        '"add_k_proj", "add_v_proj", "to_add_out"] for SimpleTuner\'s \'all\''))
