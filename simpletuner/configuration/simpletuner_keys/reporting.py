"""SimpleTuner's config.json options about validation, evaluation, logging, hub and checkpoints."""

from __future__ import annotations

from simpletuner.configuration.simpletuner_keys.entries import ignored, refused

NO_HUB = "remove it; nothing is uploaded: push the exported output_dir/pipeline or lora/ yourself"
HUB_ONLY = "accepted; used only for uploads, and nothing is uploaded here"

REPORTING_KEYS = {
    **refused("validation_epoch_interval validate_after_step validate_after_epoch",
              "use validation_steps (every that many optimizer steps)"),
    **ignored("disable_benchmark", "accepted; no benchmark images of the base model are made "
              "(validation_on_startup validates before the first step)"),
    **refused("validation_preview", "remove it; validation images are saved when complete"),
    **ignored("validation_preview_steps", "used only with validation_preview, which is refused "
              "here"),
    **refused("validation_input", "remove it; validation is text-to-image here"),
    **refused("validation_image_format", "remove it; validation images are PNG files",
              (None, "png")),
    **ignored("validation_image_quality", "accepted; validation images are lossless PNG files"),
    **refused("validation_prompt_library", "SimpleTuner's built-in prompt library is not "
              "shipped here; list the prompts in validation_prompt or a user_prompt_library file"),
    **refused("eval_epoch_interval", "use eval_steps_interval"),
    **ignored("configs_dir", "accepted; SimpleTuner's WebUI keeps its saved configurations "
              "there, and training reads only this config.json"),
    **refused("merge_environment_config", "remove it; this config.json is read on its own, "
              "not merged over a WebUI environment's defaults: copy the options you want into "
              "it"),
    **ignored("eval_timesteps", "accepted; the eval loss draws one timestep per sample from "
              "generators seeded per (seed, rank, micro-batch): the same draws every evaluation"),
    **ignored("eval_dataset_pooling", "accepted; each eval dataset's loss is logged, and their "
              "mean as eval/loss"),
    **refused("eval_loss_disable", "remove it; set eval_steps_interval 0 (or leave out the eval "
              "datasets) to skip the eval loss"),
    **refused("evaluation_type", "remove it; CLIP scores are not computed here", (None, "none")),
    **ignored("pretrained_evaluation_model_name_or_path", "used only with "
              "evaluation_type 'clip', which is refused here"),
    **refused("validation_method", "remove it; validation runs here, on the main process",
              (None, "simpletuner-local")),
    **ignored("validation_external_script validation_external_background", "used only with "
              "validation_method 'external-script', which is refused here"),
    **refused("validation_randomize", "remove it; every validation uses validation_seed"),
    **ignored("validation_multigpu", "accepted; the main process makes every validation image"),
    **ignored("validation_seed_source", "accepted; validation noise comes from a CPU generator "
              "seeded with validation_seed, identical on every device"),
    **refused("validation_noise_scheduler", "remove it; validation uses the model's own "
              "scheduler"),
    **ignored("validation_stitch_input_location", "used only by edit models, which are not "
              "supported here"),
    **refused("validation_adapter_path", "remove it; validation uses the weights being trained"),
    **ignored("validation_adapter_name validation_adapter_strength validation_adapter_mode "
              "validation_adapter_config", "used only with validation_adapter_path, which is "
              "refused here"),
    **refused("validation_guidance_real", "remove it; validation_guidance_scale is the "
              "guidance of every family (Flux: its guidance input; Qwen-Image and Chroma: "
              "their true classifier-free guidance)", (None, 1)),
    **ignored("validation_no_cfg_until_timestep", "used only with validation_guidance_real "
              "above 1, which is refused here"),
    **ignored("i_know_what_i_am_doing", "accepted; it overrides no check here"),
    # Logging and trackers
    **refused("logging_dir", "remove it; logs go to output_dir/logs", (None, "logs")),
    **ignored("tracker_image_layout", "accepted; each tracker shows the images its own way"),
    **ignored("custom_tracker", "used only with report_to 'custom-tracker', which is refused "
              "here"),
    **refused("webhook_config", "remove it; no webhooks are called here"),
    **ignored("webhook_reporting_interval", "used only with webhook_config, which is refused "
              "here"),
    **refused("enable_watermark", "remove it; images are not watermarked here"),
    # Hub and model card
    **refused("push_to_hub push_checkpoints_to_hub", NO_HUB),
    **refused("publishing_config post_checkpoint_script post_upload_script", "remove it; run "
              "your script after the run (its output_dir holds the checkpoints and the export)"),
    **ignored("hub_model_id push_to_hub_background model_card_private", HUB_ONLY),
    **ignored("model_card_safe_for_work model_card_base_model", "accepted; the model card names "
              "the base model folder and the training settings"),
    **refused("model_card_note modelspec_comment", "remove it; edit the exported model card "
              "(README.md) to add text"),
    # Checkpoints
    **refused("checkpoint_epoch_interval", "use checkpointing_steps (every that many optimizer "
              "steps)"),
    **refused("checkpointing_rolling_steps", "use checkpointing_steps and "
              "checkpoints_total_limit", (None, 0)),
    **ignored("checkpoints_rolling_total_limit", "used only with checkpointing_rolling_steps, "
              "which is refused here"),
    **ignored("checkpointing_use_tempdir checkpointing_use_tempfolder delete_invalid_checkpoints",
              "accepted; checkpoints are always staged, verified and renamed, and an incomplete "
              "one is never resumed from"),
}
