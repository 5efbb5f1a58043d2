"""Qwen-Image: a Qwen2.5-VL text encoder and a flow transformer; model_flavour edit-v1 and
edit-v2 train Qwen-Image-Edit and Qwen-Image-Edit-Plus folders on edit pairs (edit.py);
model_flavour v2.1 trains Qwen-Image 2.1 folders (v21.py)."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import DIFFUSION_MODEL

EDIT = "simpletuner.families.qwen_image.edit."
TINY = "simpletuner.families.qwen_image.tiny."

SPEC = FamilySpec(
    name="qwen_image", objective=FLOW,
    adapter="simpletuner.families.qwen_image.adapter.QwenImageAdapter",
    pipeline_prefixes=(("QwenImage", "qwen_image"),), comfyui_layout=DIFFUSION_MODEL,
    tiny_models={"tiny-qwen_image": TINY + "build_qwen_image",
                 "tiny-qwen_image-edit": TINY + "build_qwen_image_edit",
                 "tiny-qwen_image-edit-plus": TINY + "build_qwen_image_edit_plus",
                 "tiny-qwen_image-v2.1": "simpletuner.families.qwen_image.tiny_v21."
                                         "build_qwen_image_v21"},
    variant_adapters={"QwenImageEditPipeline": EDIT + "QwenImageEditAdapter",
                      "QwenImageEditPlusPipeline": EDIT + "QwenImageEditPlusAdapter",
                      "QwenImage21Pipeline": "simpletuner.families.qwen_image.v21."
                                             "QwenImage21Adapter"},
    reference_flavours={"edit-v1": 1, "edit-v2": 3},
    edits_need_references=True,
    swappable_block_keys=("num_layers",))
