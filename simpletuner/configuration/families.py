"""The model families this trainer supports, by SimpleTuner's model_family names. A new family
is one name here and its adapter in models/registry.py."""

MODEL_FAMILIES = ("sd1x", "sd2x", "sdxl", "sd3", "flux", "chroma", "qwen_image", "z_image",
                  "flux2", "wan")
UNET_FAMILIES = ("sd1x", "sd2x", "sdxl")  # predict noise (DDPM)
FLOW_FAMILIES = tuple(f for f in MODEL_FAMILIES if f not in UNET_FAMILIES)  # flow matching
