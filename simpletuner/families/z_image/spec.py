"""Z-Image: a Qwen3 text encoder and a single-stream flow transformer."""

from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import DIFFUSION_MODEL

SPEC = FamilySpec(
    name="z_image", objective=FLOW, adapter="simpletuner.families.z_image.adapter.ZImageAdapter",
    # Z-Image-Omni's folders are another model, not supported here
    pipeline_prefixes=(("ZImageOmni", "z_image_omni"), ("ZImage", "z_image")),
    comfyui_layout=DIFFUSION_MODEL,
    tiny_models={"tiny-z_image": "simpletuner.families.z_image.tiny.build_z_image"},
    # ZImagePipeline runs the unconditional pass whenever guidance_scale > 0.
    guidance_scale_without_cfg=0.0,
    # the noise and context refiners (n_refiner_layers each), the main layers
    swappable_block_keys=("n_refiner_layers", "n_refiner_layers", "n_layers"),
    # SimpleTuner's training adapters of the distilled Turbo (assistant_lora_path)
    default_assistants={
        "turbo": "ostris/zimage_turbo_training_adapter, zimage_turbo_training_adapter_v1"
                 ".safetensors",
        "turbo-ostris-v2": "ostris/zimage_turbo_training_adapter, "
                           "zimage_turbo_training_adapter_v2.safetensors"})
