"""SimpleTuner's option names and values that this trainer does not support (yet), with advice.

A SimpleTuner user's config.json and multidatabackend.json are full of such keys. Reporting them
as typos ("did you mean 'model_type'?" for ``lora_type``) sends people the wrong way, so a key or
value found here gets "SimpleTuner option 'X' is not supported here" and what to do instead.
The tables are only consulted for keys and values the dataclasses reject: an option that becomes
supported takes over by being added to options.py or datasets.py (a test keeps them disjoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DROP = "remove it"
NO_QUANTISATION = ("remove it; quantisation is chosen per component with base_model_precision "
                   "and text_encoder_<n>_precision")
NO_HUB = "remove it; nothing is uploaded: push the exported output_dir/pipeline or lora/ yourself"
SINGLE_MODEL_FOLDER = ("remove it; every component comes from the diffusers folder in "
                       "pretrained_model_name_or_path (assemble one folder with the parts you want)")
PER_DATASET = "set it per dataset in multidatabackend.json"
STANDARD_LORA = "remove it; LoRA here is standard peft LoRA (model_type 'lora', lora_rank, ...)"
NO_TEXT_ENCODER_TRAINING = "remove it; text encoders are frozen and their embeddings cached"
FIXED_CACHES = "remove it; caches are built once before training and reused by the next run"
FIXED_IO = "remove it; discovery and caching size their own workers and batches"
NO_TIMESTEP_BIAS = "remove it; timesteps are sampled uniformly (UNet families) or per flow_*"
NO_ATTENTION_CHOICE = "remove it; attention uses PyTorch's scaled_dot_product_attention"

_CONFIG_KEYS: dict[str, str] = {
    # Model and loading
    "model_flavour": "remove it; point pretrained_model_name_or_path at that flavour's local "
                     "diffusers folder",
    "lora_type": STANDARD_LORA, "lycoris_config": STANDARD_LORA, "init_lora": STANDARD_LORA,
    "use_dora": STANDARD_LORA, "flux_lora_target": "use lora_target_modules",
    "base_model_default_dtype": NO_QUANTISATION,
    "quantize_via": NO_QUANTISATION, "quantize_activations": NO_QUANTISATION,
    "text_encoder_4_precision": "remove it; no family here has a fourth text encoder",
    "pretrained_vae_model_name_or_path": SINGLE_MODEL_FOLDER,
    "pretrained_transformer_model_name_or_path": SINGLE_MODEL_FOLDER,
    "pretrained_unet_model_name_or_path": SINGLE_MODEL_FOLDER,
    "pretrained_transformer_subfolder": SINGLE_MODEL_FOLDER,
    "pretrained_unet_subfolder": SINGLE_MODEL_FOLDER,
    "revision": SINGLE_MODEL_FOLDER, "variant": SINGLE_MODEL_FOLDER,
    "vae_dtype": "remove it; the VAE runs in float32 while latents are cached",
    "prediction_type": "remove it; the prediction type comes from the model's scheduler config",
    "fuse_qkv_projections": DROP, "attention_mechanism": NO_ATTENTION_CHOICE,
    "enable_xformers_memory_efficient_attention": NO_ATTENTION_CHOICE,
    "train_text_encoder": NO_TEXT_ENCODER_TRAINING, "text_encoder_lr": NO_TEXT_ENCODER_TRAINING,
    "freeze_encoder": NO_TEXT_ENCODER_TRAINING, "t5_padding": DROP,
    "offload_during_startup": DROP, "keep_vae_loaded": DROP,
    "vae_enable_tiling": DROP, "vae_enable_slicing": DROP,
    # Data, caches and buckets
    "minimum_image_size": PER_DATASET, "maximum_image_size": PER_DATASET,
    "target_downsample_size": PER_DATASET, "instance_prompt": PER_DATASET,
    "cache_dir": "remove it; caches live in output_dir/cache (per dataset: cache_dir, "
                 "cache_dir_vae in multidatabackend.json)",
    "cache_dir_text": "remove it; give the text_embeds entry of multidatabackend.json a cache_dir",
    "cache_dir_vae": "set cache_dir_vae per dataset in multidatabackend.json",
    "aspect_bucket_rounding": "remove it; bucket sizes are rounded to aspect_bucket_alignment",
    "aspect_bucket_worker_count": FIXED_IO, "max_workers": FIXED_IO, "read_batch_size": FIXED_IO,
    "write_batch_size": FIXED_IO, "vae_batch_size": FIXED_IO, "image_processing_batch_size": FIXED_IO,
    "torch_num_threads": FIXED_IO, "dataloader_prefetch": FIXED_IO,
    "dataloader_prefetch_qlen": FIXED_IO,
    "vae_cache_ondemand": FIXED_CACHES, "vae_cache_scan_behaviour": FIXED_CACHES,
    "skip_file_discovery": FIXED_CACHES, "preserve_data_backend_cache": FIXED_CACHES,
    "compress_disk_cache": FIXED_CACHES, "metadata_update_interval": FIXED_CACHES,
    "override_dataset_config": FIXED_CACHES,
    "delete_unwanted_images": "remove it; unusable images are skipped and reported, never deleted",
    "delete_problematic_images": "remove it; unusable images are skipped and reported, never "
                                 "deleted",
    "disable_bucket_pruning": "remove it; buckets smaller than the effective batch are reported "
                              "(see allow_dataset_oversubscription)",
    "ignore_final_epochs": DROP, "seed_for_each_device": "remove it; every rank shares one seed",
    # Optimisation
    "optimizer_beta1": "use adam_beta1", "optimizer_beta2": "use adam_beta2",
    "use_8bit_adam": "use optimizer 'ao-adamw8bit' (or 'bnb-adamw8bit' on CUDA)",
    "lr_scale": "remove it; set learning_rate to the value you want",
    "gradient_precision": DROP, "grad_clip_method": "remove it; max_grad_norm clips the total norm",
    "gradient_checkpointing_interval": "remove it; gradient_checkpointing applies to every block",
    "allow_tf32": DROP, "disable_tf32": DROP,
    "timestep_bias_strategy": NO_TIMESTEP_BIAS, "timestep_bias_multiplier": NO_TIMESTEP_BIAS,
    "timestep_bias_begin": NO_TIMESTEP_BIAS, "timestep_bias_end": NO_TIMESTEP_BIAS,
    "timestep_bias_portion": NO_TIMESTEP_BIAS,
    "input_perturbation": DROP, "noise_offset_probability": "remove it; noise_offset applies to "
                                                            "every sample",
    "use_soft_min_snr": "remove it; snr_gamma is the Min-SNR weighting offered",
    "rescale_betas_zero_snr": DROP, "training_scheduler_timestep_spacing": DROP,
    "flow_schedule_shift": "use flow_shift (same meaning)",
    "flow_schedule_auto_shift": "remove it; flow_shift unset uses the scheduler's own shift",
    "flow_use_uniform_schedule": "use flow_timestep_sampling 'uniform'",
    "flow_use_beta_schedule": "use flow_timestep_sampling",
    "flux_guidance_mode": "use flux_guidance_value (a constant)",
    "flux_guidance_min": "use flux_guidance_value", "flux_guidance_max": "use flux_guidance_value",
    "ema_update_interval": DROP, "ema_device": DROP, "ema_cpu_only": DROP,
    "ema_foreach_disable": DROP, "ema_validation": "remove it; validation uses the EMA weights "
                                                   "when use_ema is on",
    # Logging, validation, hub
    "logging_dir": "remove it; logs go to output_dir/logs",
    "tracker_image_layout": DROP, "webhook_config": DROP,
    "push_to_hub": NO_HUB, "hub_model_id": NO_HUB, "push_checkpoints_to_hub": NO_HUB,
    "model_card_note": DROP, "model_card_safe_for_work": DROP,
    "num_validation_images": "remove it; one image per validation_prompt",
    "validation_prompt_library": "list the prompts in validation_prompt",
    "user_prompt_library": "list the prompts in validation_prompt",
    "validation_guidance_rescale": DROP, "validation_guidance_real": DROP,
    "validation_no_cfg_until_timestep": DROP, "validation_noise_scheduler": DROP,
    "validation_torch_compile": DROP, "validation_disable_unconditional": DROP,
    "validation_seed_source": "use validation_seed", "validation_lycoris_strength": STANDARD_LORA,
    "disable_benchmark": DROP, "evaluation_type": DROP, "num_eval_images": DROP,
"eval_dataset_id": DROP,
    "checkpointing_use_tempfolder": "remove it; checkpoints are always staged and renamed",
    "i_know_what_i_am_doing": DROP,
    # Not built yet here
}

_DATASET_KEYS: dict[str, str] = {
    "probability": "remove it; each dataset's samples are used repeats + 1 times per epoch",
    "skip_file_discovery": FIXED_CACHES, "preserve_data_backend_cache": FIXED_CACHES,
    "scan_for_errors": "remove it; every image's header is checked during discovery",
    "vae_cache_clear_each_epoch": "remove it; latents are cached once and reused",
    "hash_filenames": "remove it; cache files are named by sample id",
    "is_regularisation_data": DROP, "is_regularization_data": DROP,
    "caption_filter_list": "remove it; edit the captions themselves",
    "conditioning_data": DROP, "conditioning": DROP, "disable_validation": DROP,
    "ignore_epochs": DROP, "start_epoch": DROP, "start_step": DROP,
    "target_downsample_size": "remove it; images are resized straight to their bucket",
    # type 'huggingface' reads these at the top of the entry too (huggingface_block.py)
    "streaming": "remove it; every row of a huggingface dataset is indexed before training",
    "num_proc": "remove it; rows are indexed in one pass, no filter processes are started",
    "filter_func": "remove it; filter the dataset first (datasets' Dataset.filter, then "
                   "save_to_disk) and point dataset_name at the saved folder",
    "auto_load": "remove it; a huggingface dataset is opened when first needed",
    "video": DROP, "write_batch_size": FIXED_IO, "read_batch_size": FIXED_IO,
    "aspect_bucket_rounding": "remove it; bucket sizes are rounded to aspect_bucket_alignment",
}

_CONFIG_VALUES: dict[str, dict[str, str]] = {
    "model_family": {
        "legacy": "use 'sd1x' or 'sd2x' (SimpleTuner's older name for both)",
        **{name: "this family is not supported here (supported: sd1x, sd2x, sdxl, sd3, flux)"
           for name in ("pixart_sigma", "kolors", "auraflow", "sana", "ltxvideo", "wan",
                        "hidream", "lumina2", "cosmos2image", "omnigen", "hunyuanvideo",
                        "deepfloyd", "smoldit", "chroma", "qwen_image")},
    },
    "optimizer": {
        **{name: "use one of adamw, adamw_bf16, ao-adamw8bit, bnb-adamw8bit, prodigy, adafactor, "
              "lion" for name in ("adamw_schedulefree", "soap", "ademamix", "came")},
        "adamw8bit": "use 'ao-adamw8bit' (or 'bnb-adamw8bit' on CUDA)",
        "optimi-adamw": "use 'adamw_bf16' (torch-optimi's AdamW with Kahan summation)",
        "optimi-stableadamw": "use 'adamw_bf16' (torch-optimi's AdamW with Kahan summation)",
        "optimi-lion": "use 'lion'",
    },
    "lr_scheduler": {"sine": "use 'cosine' or 'cosine_with_restarts'",
                     "inverse_sqrt": "use 'polynomial' or 'cosine'",
                     "constant_with_restarts": "use 'cosine_with_restarts' or 'constant'"},
    "mixed_precision": {"fp8": "use 'bf16'; fp8 training is not supported here"},
    "report_to": {name: "use 'tensorboard', 'wandb', 'all' or 'none'"
                  for name in ("comet_ml", "aim", "clearml", "mlflow")},
}

_DATASET_VALUES: dict[str, dict[str, str]] = {
    "dataset_type": {name: "this dataset type is not supported here; remove the entry"
                     for name in ("conditioning", "video", "audio")},
    "caption_strategy": {"csv": "use 'textfile' (a .txt beside each image)"},
    "crop_style": {"face": "use 'center', 'random' or 'corner'"},
}

# Options that exist here under SimpleTuner's name but do not mean the same thing.
_CONFIG_DIFFERENT: dict[str, str] = {
    "mixed_precision": "here it is accelerate's autocast over float32 weights; SimpleTuner also "
                       "keeps the base weights in that precision",
    "validation_resolution": "here one integer, the side of square images; SimpleTuner also "
                             "takes 'WxH' and comma-separated lists",
    "num_train_epochs": "SimpleTuner takes 0 for 'not set'; here leave it out or write null",
    "max_train_steps": "SimpleTuner takes 0 for 'not set'; here leave it out or write null",
}
_DATASET_DIFFERENT: dict[str, str] = {
    "cache_dir": "on an image dataset here it is the folder of that dataset's text-embedding "
                 "cache (SimpleTuner sets it on the text_embeds entry, which is accepted too)",
}


# SimpleTuner's name -> the name of the same option here.
_CONFIG_ALIASES: dict[str, str] = {"validation_guidance": "validation_guidance_scale"}


@dataclass(frozen=True)
class SimpleTunerVocabulary:
    """SimpleTuner's names for one file: what is unsupported here and what means otherwise."""

    unsupported_keys: dict[str, str]
    unsupported_values: dict[str, dict[str, str]]
    different_meaning: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def canonical(self, key: str) -> str:
        return self.aliases.get(key, key)

    def unsupported_key(self, key: str) -> str | None:
        advice = self.unsupported_keys.get(key)
        if advice is None:
            return None
        return f"SimpleTuner option '{key}' is not supported here; {advice}"

    def unsupported_value(self, key: str, value: object) -> str | None:
        advice = self.unsupported_values.get(key, {}).get(value) if isinstance(value, str) else None
        if advice is None:
            return None
        return f"SimpleTuner's {key} '{value}' is not supported here; {advice}"

    def meaning_note(self, key: str) -> str:
        note = self.different_meaning.get(key)
        return f" (differs from SimpleTuner: {note})" if note else ""


CONFIG_JSON = SimpleTunerVocabulary(_CONFIG_KEYS, _CONFIG_VALUES, _CONFIG_DIFFERENT,
                                    _CONFIG_ALIASES)
MULTIDATABACKEND_JSON = SimpleTunerVocabulary(_DATASET_KEYS, _DATASET_VALUES, _DATASET_DIFFERENT)
