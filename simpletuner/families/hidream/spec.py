"""HiDream-I1 (HiDream-ai): two CLIP encoders (pooled), T5 and Llama 3.1 (every layer's hidden
states), a flow transformer with mixture-of-experts feed-forwards."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import DIFFUSION_MODEL

SPEC = FamilySpec(
    name="hidream", objective=FLOW,
    adapter="simpletuner.families.hidream.adapter.HiDreamAdapter",
    pipeline_prefixes=(("HiDreamImage", "hidream"),),
    # ComfyUI's HiDream model has the diffusers module names under diffusion_model.
    comfyui_layout=DIFFUSION_MODEL,
    tiny_models={"tiny-hidream": "simpletuner.families.hidream.tiny.build_hidream"},
    simpletuner_keys={"hidream_use_load_balancing_loss": (
        "remove it; the experts' load-balancing loss is not added here (the loss is the "
        "pipeline's flow target alone, as diffusers' transformer computes it)")},
    swappable_block_keys=("num_layers", "num_single_layers"))
