"""Kandinsky 5.0 Image Lite (kandinskylab): Qwen2.5-VL hidden states and CLIP's pooled embedding
read through Kandinsky5T2IPipeline's own encode_prompt, Flux VAE latents scaled (not shifted),
and a text-then-visual block transformer on [B, 1, H, W, C] latents; the i2i flavours train a
Kandinsky5I2IPipeline folder on edit pairs (i2i.py)."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

TINY = "simpletuner.families.kandinsky5_image.tiny."

SPEC = FamilySpec(
    name="kandinsky5_image", objective=FLOW,
    adapter="simpletuner.families.kandinsky5_image.adapter.Kandinsky5ImageAdapter",
    # Kandinsky 5.0 Video (Kandinsky5T2VPipeline, Kandinsky5I2VPipeline) is another model.
    pipeline_prefixes=(("Kandinsky5T2V", "kandinsky5_video"),
                       ("Kandinsky5I2V", "kandinsky5_video"),
                       ("Kandinsky5T2I", "kandinsky5_image"),
                       ("Kandinsky5I2I", "kandinsky5_image")),
    # KandinskyLoraLoaderMixin reads transformer. keys as they are (no converter, no alpha).
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-kandinsky5_image": TINY + "build_kandinsky5_image",
                 "tiny-kandinsky5_image-i2i": TINY + "build_kandinsky5_image_i2i"},
    variant_adapters={
        "Kandinsky5I2IPipeline": "simpletuner.families.kandinsky5_image.i2i."
                                 "Kandinsky5ImageI2IAdapter"},
    # SimpleTuner's image-to-image flavours (its t2i-lite-sft and t2i-lite-pretrain: weights)
    reference_flavours={"i2i-lite-sft": 1, "i2i-lite-pretrain": 1},
    edits_need_references=True,
    # the text blocks run first, then the visual ones
    swappable_block_keys=("num_text_blocks", "num_visual_blocks"))
