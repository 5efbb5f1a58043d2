"""HunyuanVideo 1.5 text-to-video and image-to-video: a video family, its folder's
model_index.json (flavours.py) picking the adapter."""

from simpletuner.families.frame_rule import FrameRule
from simpletuner.families.hunyuanvideo.flavours import folder_kind, unsupported_folder
from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

HERE = "simpletuner.families.hunyuanvideo."

SPEC = FamilySpec(
    name="hunyuanvideo", objective=FLOW, adapter=HERE + "adapter.HunyuanVideoAdapter",
    # HunyuanVideo 1.0's folders too, so that they are refused by name (flavours.py).
    pipeline_prefixes=(("HunyuanVideo", "hunyuanvideo"),),
    # transformer. keys, alpha folded in: what the transformer's load_lora_adapter reads
    # (diffusers 0.42 has no converter of HunyuanVideo 1.5's original names).
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-hunyuanvideo": HERE + "tiny.build_hunyuanvideo",
                 "tiny-hunyuanvideo-i2v": HERE + "tiny.build_hunyuanvideo_i2v"},
    folder_variant=folder_kind, variant_adapters={"i2v": HERE + "i2v.HunyuanVideoI2VAdapter"},
    folder_problem=unsupported_folder,
    # The VAE compresses time 4x and keeps the first frame on its own: 4n+1 frames.
    frame_rule=FrameRule(multiple=4, remainder=1),
    swappable_block_keys=("num_layers",))
