"""Kandinsky 5.0 Image Lite (kandinskylab): Qwen2.5-VL hidden states and CLIP's pooled embedding
read through Kandinsky5T2IPipeline's own encode_prompt, Flux VAE latents scaled (not shifted),
and a text-then-visual block transformer on [B, 1, H, W, C] latents."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import TRANSFORMER_ALPHA_FOLDED

SPEC = FamilySpec(
    name="kandinsky5_image", objective=FLOW,
    adapter="simpletuner.families.kandinsky5_image.adapter.Kandinsky5ImageAdapter",
    # Kandinsky 5.0 Video (Kandinsky5T2VPipeline, Kandinsky5I2VPipeline) is another model.
    pipeline_prefixes=(("Kandinsky5T2V", "kandinsky5_video"),
                       ("Kandinsky5I2V", "kandinsky5_video"),
                       ("Kandinsky5T2I", "kandinsky5_image")),
    # KandinskyLoraLoaderMixin reads transformer. keys as they are (no converter, no alpha).
    comfyui_layout=TRANSFORMER_ALPHA_FOLDED,
    tiny_models={"tiny-kandinsky5_image":
                 "simpletuner.families.kandinsky5_image.tiny.build_kandinsky5_image"},
    # the text blocks run first, then the visual ones
    swappable_block_keys=("num_text_blocks", "num_visual_blocks"))
