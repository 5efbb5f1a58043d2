"""Wan 2.1 text-to-video and image-to-video, Wan 2.2 T2V-A14B and TI2V-5B: a video family,
its folder's layout (flavours.py) picking the adapter."""

from simpletuner.families.frame_rule import FrameRule
from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.families.wan.flavours import folder_kind, unsupported_folder
from simpletuner.families.wan.lora_layout import COMFYUI_LAYOUT

HERE = "simpletuner.families.wan."

SPEC = FamilySpec(
    name="wan", objective=FLOW, adapter=HERE + "adapter.WanAdapter",
    pipeline_prefixes=(("Wan", "wan"),), comfyui_layout=COMFYUI_LAYOUT,
    tiny_models={"tiny-wan": HERE + "tiny.build_wan", "tiny-wan-i2v": HERE + "tiny.build_wan_i2v",
                 "tiny-wan22": HERE + "tiny_wan22.build_wan22",
                 "tiny-wan22-ti2v": HERE + "tiny_wan22.build_wan22_ti2v"},
    folder_variant=folder_kind,
    variant_adapters={"i2v": HERE + "i2v.WanI2VAdapter", "a14b": HERE + "wan22.WanExpertAdapter",
                      "ti2v": HERE + "wan22.WanTI2VAdapter"},
    folder_problem=unsupported_folder,
    # The VAE compresses time 4x and keeps the first frame on its own: 4n+1 frames.
    frame_rule=FrameRule(multiple=4, remainder=1, fps=15),  # SimpleTuner's Wan framerate
    swappable_block_keys=("num_layers",),
    attention_heads_key="num_attention_heads",  # context_parallel_size
    token_routing=True)  # tread_config: adapter.py's token_layout
