"""SimpleTuner's options that apply to one model family.

Options of a family not supported here are accepted with any value: SimpleTuner itself ignores
them for every other family, and model_family already refuses theirs. A supported family's
own options are named by its spec (FamilySpec.simpletuner_keys), in its folder."""

from __future__ import annotations

from simpletuner.configuration.simpletuner_keys.entries import Foreign, ignored, refused
from simpletuner.families import family_specs

_OTHER_FAMILIES = {
    "ace_step": "validation_lyrics validation_audio_duration lyrics_embedder_train "
                "lyrics_embedder_optimizer lyrics_embedder_lr lyrics_embedder_lr_scheduler "
                "acestep_lora_target",
    "cosmos3": "cosmos3_reasoner_component cosmos3_generator_component",
    "deepfloyd": "deepfloyd_validation_pipeline_mode deepfloyd_validation_stage1_model "
                 "deepfloyd_validation_stage2_model deepfloyd_validation_stage3_mode "
                 "deepfloyd_validation_stage3_model deepfloyd_validation_stage1_num_inference_steps "
                 "deepfloyd_validation_stage2_num_inference_steps "
                 "deepfloyd_validation_stage1_guidance deepfloyd_validation_stage2_guidance "
                 "deepfloyd_validation_stage3_guidance deepfloyd_validation_stage3_noise_level",
    "flux3_image": "flux3_prompt_upsample",
    "minimax": "minimax_h3_reference_mode minimax_h3_target_mode minimax_h3_sparse_attention "
               "minimax_h3_sparse_block_shape minimax_h3_sparse_video_kv_fraction "
               "minimax_h3_sparse_share_heads minimax_h3_sparse_start_layer "
               "minimax_music_train_component minimax_music_rvq_encoder_model_name_or_path "
               "minimax_music_rvq_encoder_subfolder minimax_music_rvq_encoder_revision "
               "minimax_music_rvq_vae_model_name_or_path minimax_music_lm_adapter "
               "minimax_music_lm_adapter_strength minimax_music_lm_precache_mode "
               "minimax_music_lm_max_frames minimax_music_lm_window_mode "
               "minimax_music_lm_target_frames minimax_music_lm_continuation_crop_mode "
               "minimax_music_lm_min_duration_seconds minimax_music_lm_max_duration_seconds",
    "moss_image": "moss_image_auto_json moss_image_prompt_upsample "
                  "moss_image_prompt_upsampler_model_id moss_image_validation_shift "
                  "moss_image_uncond_skip_layers",
}


def _other_family_keys() -> dict:
    keys = {}
    for family, names in _OTHER_FAMILIES.items():
        keys.update(ignored(names, f"applies to model_family '{family}' only, which is not "
                                   "supported here"))
    return keys


def _presets() -> str:
    """Which families read which of SimpleTuner's flux_lora_target names."""
    named = [f"model_family '{spec.name}' reads {', '.join(spec.lora_target_presets)}"
             for spec in family_specs() if spec.lora_target_presets]
    return f" ({'; '.join(named)}; 'controlnet' needs ControlNet, not supported here)" if (
        named) else ""


def _supported_family_keys() -> dict:
    """Each supported family's own options, as its spec words them."""
    return {key: Foreign(advice) for spec in family_specs()
            for key, advice in spec.simpletuner_keys.items()}


FAMILY_KEYS = {
    **_other_family_keys(),
    **_supported_family_keys(),
    # Flux
    **refused("flux_lora_target", "use lora_target_modules (module name suffixes); unset = "
              "the attention projections" + _presets(), (None, "all")),
    **refused("flux_guidance_mode", "use flux_guidance_value (a constant)", (None, "constant")),
    **ignored("flux_guidance_min flux_guidance_max", "used only with flux_guidance_mode "
              "'random-range', which is refused here"),
    **refused("flux_attention_masked_training", "remove it; Flux attention is not masked by "
              "the prompt's padding here (Chroma's always is, as in its pipeline)"),
    **refused("flux_fast_schedule", "remove it; Flux trains on its ordinary schedule here"),
    **ignored("fuse_qkv_projections", "accepted; it selects an attention kernel, and attention "
              "here uses PyTorch's scaled_dot_product_attention"),
    # HiDream (its spec refuses hidream_use_load_balancing_loss)
    **ignored("hidream_load_balancing_loss_weight", "used only with "
              "hidream_use_load_balancing_loss, which is refused here"),
    # FLUX.2
    **refused("custom_text_encoder_intermediary_layers", "remove it; FLUX.2 stacks its "
              "pipeline's text encoder layers (dev: 10, 20, 30; klein: 9, 18, 27), as "
              "validation and the exported pipeline do"),
    # Ideogram 4
    **refused("ideogram_auto_json ideogram_prompt_upsample ideogram_prompt_enhancer_head_id",
              "remove it; Ideogram 4 trains on the captions as written, without its prompt "
              "enhancer"),
    **refused("ideogram_validation ideogram_schedule_mu ideogram_schedule_std "
              "ideogram_fp8_base_upcast ideogram_uncond_ramtorch", "remove it; validation "
              "calls Ideogram4Pipeline with its own defaults, and the unconditional "
              "transformer stays frozen as loaded"),
    **ignored("ideogram_load_unconditional_transformer", "accepted; the unconditional "
              "transformer is always loaded, as the pipeline needs it"),
    # Krea 2
    **refused("krea2_reference_latents", "remove it; Krea 2 trains text-to-image here, "
              "without reference latents"),
    # SD3
    **refused("sd3_clip_uncond_behaviour sd3_t5_uncond_behaviour", "remove it; the "
              "unconditional embedding is the empty prompt's", (None, "empty_string")),
    # SDXL
    **refused("sdxl_refiner_uses_full_range", "remove it; SDXL refiner training is not "
              "supported here"),
    **refused("sdxl_validation_pipeline_mode", "remove it; validation uses the trained "
              "pipeline alone", (None, "trained-stage")),
    **ignored("sdxl_validation_stage1_model sdxl_validation_stage2_model", "used only with "
              "sdxl_validation_pipeline_mode 'full-pipeline', which is refused here"),
    # Wan (2.1 text-to-video and image-to-video, 2.2 T2V-A14B and TI2V-5B)
    **ignored("wan_force_2_1_time_embedding", "accepted; Wan 2.1 (text- and image-to-video) "
              "and 2.2 A14B models have the 2.1 time embedding already"),
    **ignored("wan_validation_load_other_stage", "accepted; a two-expert Wan 2.2 run always "
              "validates with both experts (the other frozen as loaded), as its export holds "
              "both"),
}
