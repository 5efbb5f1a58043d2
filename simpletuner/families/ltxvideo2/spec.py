"""LTX-2 (Lightricks/LTX-2; SimpleTuner's flavours dev, 2.3-dev, 2.5-dev where the folder has
LTX2Pipeline's layout): a joint audio-video model whose video VAE compresses time 8x (8n+1
frames)."""

from simpletuner.families.frame_rule import FrameRule
from simpletuner.families.ltxvideo.spec import COMFYUI_LAYOUT
from simpletuner.families.spec import FLOW, FamilySpec

HERE = "simpletuner.families.ltxvideo2."

SPEC = FamilySpec(
    name="ltxvideo2", objective=FLOW, adapter=HERE + "adapter.LTX2Adapter",
    pipeline_prefixes=(("LTX2", "ltxvideo2"),), comfyui_layout=COMFYUI_LAYOUT,
    tiny_models={"tiny-ltxvideo2": HERE + "tiny.build_ltxvideo2"},
    guidance_rescale=True,
    frame_rule=FrameRule(multiple=8, remainder=1),
    swappable_block_keys=("num_layers",))
