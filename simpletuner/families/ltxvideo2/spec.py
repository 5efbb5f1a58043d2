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
    trains_sound=True,
    swappable_block_keys=("num_layers",),
    simpletuner_keys={
        **{key: "remove it; validation calls LTX2Pipeline itself, text-to-video with its own "
                "audio guidance" for key in (
            "ltx2_validation_pipeline_mode ltx2_validation_spatial_upsampler_model "
            "ltx2_validation_spatial_upsampler_filename ltx2_validation_audio_guidance "
            "validation_audio_only validation_ltx2_video_conditioning").split()},
        **{key: "remove it; LTX-2 trains text-to-video here, every frame noised (first-frame, "
                "prefix, suffix, mask and reference conditioning are not supported)" for key in (
            "ltx2_intrinsic_conditioning ltx2_first_frame_conditioning_probability "
            "ltx2_prefix_conditioning_probability ltx2_suffix_conditioning_probability "
            "ltx2_mask_conditioning_probability ltx2_prefix_conditioning_frames "
            "ltx2_suffix_conditioning_frames ltx2_reference_spatial_scale_factor "
            "ltx2_reference_temporal_scale_factor").split()}})
