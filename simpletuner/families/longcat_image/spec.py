"""LongCat-Image (meituan-longcat): a Qwen2.5-VL text encoder read through LongCatImagePipeline's
own encode_prompt, Flux VAE latents packed 2x2 and a Flux-like flow transformer; model_flavour
'edit' trains a LongCatImageEditPipeline folder on edit pairs (edit.py)."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

TINY = "simpletuner.families.longcat_image.tiny."

SPEC = FamilySpec(
    name="longcat_image", objective=FLOW,
    adapter="simpletuner.families.longcat_image.adapter.LongCatImageAdapter",
    pipeline_prefixes=(("LongCatImage", "longcat_image"),),
    # LongCatImagePipeline has no LoRA loader of its own: its transformer's load_lora_adapter
    # reads transformer. keys as they are (no alpha).
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-longcat_image": TINY + "build_longcat_image",
                 "tiny-longcat_image-edit": TINY + "build_longcat_image_edit"},
    variant_adapters={
        "LongCatImageEditPipeline": "simpletuner.families.longcat_image.edit."
                                    "LongCatImageEditAdapter"},
    reference_flavours={"edit": 1},
    edits_need_references=True,
    # the joint blocks, then the single-stream ones
    swappable_block_keys=("num_layers", "num_single_layers"))
