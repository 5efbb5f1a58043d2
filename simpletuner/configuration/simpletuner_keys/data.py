"""SimpleTuner's config.json options about datasets, caches and buckets."""

from __future__ import annotations

from simpletuner.configuration.simpletuner_keys.entries import ignored, refused

ONDEMAND = ("accepted; the latents are the same whether encoded as each step needs them or "
            "before training: here they are cached before training (each dataset's "
            "cache_dir_vae), and reused by the next run")

PER_DATASET = "set it per dataset in multidatabackend.json"
FIXED_CACHES = "accepted; caches are built once before training, checked against the files, " \
               "and reused by the next run"
FIXED_IO = "accepted; discovery and caching size their own workers and batches"
NEVER_DELETED = "remove it; unusable images are skipped and reported, never deleted"
NO_ASPECT_ROUNDING = ("accepted; buckets are keyed by their aligned pixel size "
                      "(aspect_bucket_alignment), so there is no aspect ratio to round")
LOGGING = "accepted; the run logs what it skips and trims (skipped_files.json, plan)"

DATA_KEYS = {
    **refused("caption_strategy instance_prompt parquet_caption_column parquet_filename_column",
              PER_DATASET + " (parquet_*: in the dataset's parquet block)"),
    **refused("prepend_instance_prompt only_instance_prompt", PER_DATASET),
    **refused("disable_multiline_split", PER_DATASET + " (SimpleTuner's WebUI copies this "
              "default into the datasets it creates; its trainer reads the dataset's key)"),
    **refused("aws_max_pool_connections", PER_DATASET, (None, 128)),
    **ignored("aspect_bucket_rounding", NO_ASPECT_ROUNDING),
    **ignored("disable_bucket_pruning", "accepted; no image is pruned silently here: a bucket "
              "too small for the effective batch stops the run with a report (or is extended "
              "by allow_dataset_oversubscription)"),
    **refused("max_upscale_threshold", "remove it; use minimum_image_size to skip images that "
              "would be upscaled"),
    **refused("tokenizer_max_length", "remove it; each text encoder uses its tokenizer's "
              "maximum length"),
    **refused("cache_dir", "remove it; caches live in output_dir/cache (per dataset: cache_dir, "
              "cache_dir_vae in multidatabackend.json)"),
    **refused("cache_dir_text", "remove it; give the text_embeds entry of multidatabackend.json "
              "a cache_dir"),
    **refused("cache_dir_vae", "set cache_dir_vae per dataset in multidatabackend.json",
              (None, "")),
    **refused("vae_cache_disable text_cache_ondemand text_cache_disable "
              "text_embed_full_cache", "remove it; latents and text embeddings are cached "
              "before training"),
    **ignored("vae_cache_ondemand", ONDEMAND),
    **ignored("vae_cache_scan_behaviour skip_file_discovery preserve_data_backend_cache "
              "override_dataset_config compress_disk_cache metadata_update_interval "
              "aspect_bucket_disable_rebuild", FIXED_CACHES),
    **ignored("max_workers read_batch_size write_batch_size image_processing_batch_size "
              "text_encoder_batch_size torch_num_threads dataloader_prefetch "
              "dataloader_prefetch_qlen dataloader_prefetch_device_threshold_mb "
              "aspect_bucket_worker_count enable_multiprocessing", FIXED_IO),
    **ignored("debug_aspect_buckets debug_dataset_loader print_filenames "
              "print_sampler_statistics", LOGGING),
    **refused("delete_unwanted_images delete_problematic_images delete_nsfw_images",
              NEVER_DELETED),
    **refused("ignore_missing_files", "remove it; a file that disappears after discovery is "
              "reported, never skipped silently"),
    **refused("enable_nsfw_check", "remove it; NSFW filtering is not supported here"),
    **ignored("nsfw_check_models nsfw_check_min_votes nsfw_check_backend_types "
              "nsfw_check_sample_types nsfw_check_video_frame_count "
              "nsfw_check_video_frame_selection nsfw_check_video_min_flagged_frames",
              "used only with enable_nsfw_check, which is refused here"),
    **ignored("data_aesthetic_score", "accepted; no aesthetic score is used"),
    **ignored("audio_max_duration_seconds audio_min_duration_seconds audio_channels "
              "audio_duration_interval audio_truncation_mode audio_flow_schedule_shift",
              "used only with audio datasets, which are refused here"),
    **ignored("conditioning_multidataset_sampling", "used only with conditioning datasets, "
              "which are refused here"),
    **refused("disk_low_threshold", "remove it; a full disk stops the run with a report "
              "(checkpoints are written whole or not at all)"),
    **ignored("disk_low_action disk_low_script", "used only with disk_low_threshold, which is "
              "refused here"),
}
