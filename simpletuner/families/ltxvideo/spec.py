"""LTX-Video 0.9.x (Lightricks/LTX-Video, -0.9.5...): text-to-video through LTXPipeline, a
video family whose VAE compresses time 8x (8n+1 frames)."""

from simpletuner.families.frame_rule import FrameRule
from simpletuner.families.spec import FLOW, FamilySpec
from simpletuner.training.adapters.lora_layouts import Layout

HERE = "simpletuner.families.ltxvideo."

# diffusers' LTX-Video loader reads ``diffusion_model.<module path>`` (LTX's own names are the
# diffusers ones) and converts no alpha keys, so alpha / rank is folded into lora_B.
COMFYUI_LAYOUT = Layout("diffusion_model. (alpha folded in)", lambda p: "diffusion_model." + p,
                        ".lora_A.weight", ".lora_B.weight", False)

SPEC = FamilySpec(
    name="ltxvideo", objective=FLOW, adapter=HERE + "adapter.LTXVideoAdapter",
    pipeline_prefixes=(("LTX", "ltxvideo"),), comfyui_layout=COMFYUI_LAYOUT,
    tiny_models={"tiny-ltxvideo": HERE + "tiny.build_ltxvideo"},
    guidance_rescale=True,
    # The VAE compresses time 8x and keeps the first frame on its own: 8n+1 frames.
    frame_rule=FrameRule(multiple=8, remainder=1),
    swappable_block_keys=("num_layers",),
    simpletuner_keys={key: "remove it; LTX-Video trains text-to-video here, every frame noised "
                      "(SimpleTuner's image-to-video share and first-frame conditioning are "
                      "not supported)" for key in ("ltx_train_mode", "ltx_i2v_prob",
                                                   "ltx_partial_noise_fraction",
                                                   "ltx_protect_first_frame")})
