"""SimpleTuner's config.json options about the optimizer, the loss, timesteps and noise."""

from __future__ import annotations

from simpletuner.configuration.simpletuner_keys.entries import ignored, refused

NO_TIMESTEP_BIAS = "remove it; timesteps are sampled uniformly (UNet families) or per flow_*"
DRAWN_HERE = ("accepted; timesteps and noise are drawn per sample from (seed, step, sample) "
              "here, the same on every rank and resume")


def _extension(switch: str, rest: str, what: str) -> dict:
    """An auxiliary objective: its switch refused when on, its settings mean nothing without it."""
    return {**refused(switch, f"remove it; {what} is not supported here"),
            **ignored(rest, f"used only with {switch}, which is refused here")}


TRAINING_KEYS = {
    **refused("lr_scale lr_scale_sqrt", "remove it; set learning_rate to the value you want"),
    **refused("prodigy_steps", "remove it; pass Prodigy's own keywords in optimizer_config"),
    **ignored("gradient_precision", "accepted; gradients take the trained weights' dtype here "
              "(float32, or bfloat16 with adamw_bf16)"),
    **refused("use_soft_min_snr", "remove it; snr_gamma is the Min-SNR weighting offered"),
    **ignored("soft_min_snr_sigma_data", "used only with use_soft_min_snr, which is refused here"),
    **refused("snr_weight", "remove it; snr_gamma is the loss weighting offered", (None, 1)),
    **ignored("ema_device ema_cpu_only ema_foreach_disable", "accepted; where the EMA copy lives "
              "does not change its weights"),
    **ignored("ema_validation", "accepted; validation uses the EMA weights when use_ema is on"),
    **refused("timestep_bias_strategy", NO_TIMESTEP_BIAS, (None, "none")),
    **ignored("timestep_bias_begin timestep_bias_end timestep_bias_multiplier "
              "timestep_bias_portion", "used only with timestep_bias_strategy, which is refused "
              "here"),
    **ignored("training_scheduler_timestep_spacing inference_scheduler_timestep_spacing",
              "accepted; training draws timesteps uniformly, validation uses the model "
              "scheduler's own spacing"),
    **ignored("disable_segmented_timestep_sampling seed_for_each_device", DRAWN_HERE),
    **refused("input_perturbation", "remove it; input perturbation is not supported here",
              (None, 0)),
    **ignored("input_perturbation_steps", "used only with input_perturbation, which is refused "
              "here"),
    **refused("noise_offset_probability", "remove it; noise_offset applies to every sample here",
              (None, 1)),
    **ignored("offset_noise", "accepted; here noise_offset alone decides (0 = off)"),
    **refused("rescale_betas_zero_snr", "remove it; the noise schedule is the model "
              "scheduler's own"),
    **refused("flow_sigmoid_scale", "remove it; flow_logit_std sets the logit-normal spread",
              (None, 1)),
    **refused("flow_use_uniform_schedule", "use flow_timestep_sampling 'uniform'"),
    **refused("flow_use_beta_schedule", "use flow_timestep_sampling ('uniform' or "
              "'logit_normal')"),
    **ignored("flow_beta_schedule_alpha flow_beta_schedule_beta", "used only with "
              "flow_use_beta_schedule, which is refused here"),
    **refused("flow_cubic_schedule_weights flow_custom_timesteps", "use flow_timestep_sampling "
              "and flow_shift"),
    **ignored("flow_timesteps_mode", "used only with flow_custom_timesteps, which is refused "
              "here"),
    **refused("t5_padding", "remove it; T5 embeddings keep the tokenizer's padding (Wan's are "
              "zero past the prompt, as in WanPipeline)", (None, "unmodified")),
    **refused("masked_loss_probability", "remove it; masked loss is not supported here",
              (None, 1)),
    **refused("scheduled_sampling_max_step_offset", "remove it; scheduled sampling is not "
              "supported here", (None, 0)),
    **ignored("scheduled_sampling_strategy scheduled_sampling_probability "
              "scheduled_sampling_prob_start scheduled_sampling_prob_end "
              "scheduled_sampling_ramp_steps scheduled_sampling_start_step "
              "scheduled_sampling_ramp_shape scheduled_sampling_sampler scheduled_sampling_order "
              "scheduled_sampling_reflexflow scheduled_sampling_reflexflow_alpha "
              "scheduled_sampling_reflexflow_beta1 scheduled_sampling_reflexflow_beta2",
              "used only with scheduled_sampling_max_step_offset, which is refused here"),
    **_extension("diff2flow_enabled", "diff2flow_loss", "diff2flow"),
    **_extension("mixflow_enabled", "mixflow_gamma", "MixFlow"),
    **_extension("xm_enabled", "xm_candidate_count xm_training_target xm_selection_scope "
                 "xm_block_size", "XM route selection"),
    **_extension("nextlat_enabled", "nextlat_block_index nextlat_weight nextlat_state_loss "
                 "nextlat_kl_weight", "NextLat"),
    **_extension("irepa_enabled", "irepa_spatial_norm_alpha irepa_projector_kernel_size", "iREPA"),
    **_extension("crepa_enabled", "crepa_block_index crepa_lambda crepa_adjacent_distance "
                 "crepa_adjacent_tau crepa_encoder crepa_encoder_frames_batch_size "
                 "crepa_use_backbone_features crepa_feature_source crepa_self_flow "
                 "crepa_teacher_block_index crepa_self_flow_mask_ratio crepa_encoder_image_size "
                 "crepa_drop_vae_encoder crepa_normalize_by_frames crepa_normalize_neighbour_sum "
                 "crepa_spatial_align crepa_use_tae crepa_scheduler crepa_warmup_steps "
                 "crepa_decay_steps crepa_lambda_end crepa_power crepa_cutoff_step "
                 "crepa_similarity_threshold crepa_similarity_ema_decay crepa_threshold_mode "
                 "crepa_cumulative_neighbors crepa_model",
                 "CREPA"),
    **_extension("twinflow_enabled", "twinflow_target_step_count", "TwinFlow"),
    **_extension("internal_guidance_enabled", "internal_guidance_loss_weight "
                 "internal_guidance_block_index validation_internal_guidance_scale",
                 "internal guidance"),
    **_extension("layersync_enabled", "layersync_student_block layersync_teacher_block "
                 "layersync_lambda", "LayerSync"),
    **_extension("urepa_enabled", "urepa_lambda urepa_manifold_weight urepa_model "
                 "urepa_encoder_image_size urepa_use_tae urepa_scheduler urepa_warmup_steps "
                 "urepa_decay_steps urepa_lambda_end urepa_power urepa_cutoff_step "
                 "urepa_similarity_threshold urepa_similarity_ema_decay urepa_threshold_mode",
                 "U-REPA"),
    **refused("use_8bit_adam", "use optimizer 'ao-adamw8bit' (or 'bnb-adamw8bit' on CUDA)"),
    **ignored("strict_epoch_limit ignore_final_epochs", "accepted; a run stops at max_train_steps or at the end of "
              "num_train_epochs, whichever comes first"),
}
