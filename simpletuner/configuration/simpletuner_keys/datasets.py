"""SimpleTuner's multidatabackend.json keys with no field here (the older entries are in
simpletuner_options.py's dataset table)."""

from __future__ import annotations

from simpletuner.configuration.simpletuner_keys.data import NO_ASPECT_ROUNDING
from simpletuner.configuration.simpletuner_keys.entries import ignored, refused

# type 'huggingface' reads these at the top of an entry, as SimpleTuner does, when they are
# fields of its block (configuration/huggingface_block.py); the others are named here.
LOCAL_HUGGINGFACE = ("remove it; point dataset_name at the dataset's local folder (save_to_disk, "
                     "parquet files or an imagefolder) or a Hub id already downloaded")
PREFILTER = ("remove it; filter the dataset first (datasets' Dataset.filter, then "
             "save_to_disk) and point dataset_name at the saved folder")
ONE_PASS = "remove it; rows are indexed in one pass, no filter processes are started"
NO_CONDITIONING = ("remove it; conditioning images are not generated here: give them as a "
                   "dataset (dataset_type 'conditioning' with conditioning_type "
                   "'reference_strict', 'mask' or 'controlnet', named by conditioning_data)")
IO_ONLY = "accepted; discovery and caching size their own workers, batches and files"
NEVER_DELETED = "remove it; unusable images are skipped and reported, never deleted"

DATASET_KEYS = {
    **refused("subfolder data_files hf_token", LOCAL_HUGGINGFACE),
    **refused("video_column audio_column composite_image_column split_composite_images",
              "remove it; huggingface datasets are read as images (image_column) here"),
    **refused("streaming", "remove it; every row of a huggingface dataset is indexed before "
              "training"),
    **refused("num_proc", ONE_PASS),
    **refused("filter_func", PREFILTER),
    **ignored("auto_load", "accepted; a huggingface dataset is opened when first needed"),
    **refused("csv_file csv_cache_dir csv_caption_column csv_url_column csv_hash_filenames "
              "csv_shorten_filenames", "belongs to type 'csv' datasets, which are not "
              "supported here; use type 'local'"),
    **refused("webshart webshart_optimise_captions webshart_optimize_captions source",
              "belongs to webshart datasets, which are not supported here; use type 'local' "
              "or 'aws'"),
    **refused("conditioning source_dataset_id "
              "conditioning_config conditioning_image_embeds "
              "cache_dir_conditioning_image_embeds conditioning_image_embed_batch_size "
              "grounding grounding_data audio slider_strength distillation_type s2v_datasets",
              NO_CONDITIONING),
    **refused("metadata_clone_source_id", "remove it; each dataset's bucket index is built from "
              "its own files"),
    **ignored("cache_file_suffix", "accepted; a dataset's bucket index cache is named by its "
              "id"),
    **refused("shuffle", "remove it; every training dataset is shuffled each epoch from the "
              "shared seed", (None, True)),
    **refused("disable_after_epoch_step", "use end_step: the dataset is no longer drawn after "
              "it (SimpleTuner also lowers its odds step by step until then)"),
    **refused("text_cache_ondemand text_cache_disable vae_cache_ondemand vae_cache_disable "
              "disable_vae_cache", "remove it; latents and text embeddings are cached before "
              "training"),
    **ignored("vae_cache_scan_behaviour compress_cache shorten_filenames hash_filenames "
              "skip_file_discovery preserve_data_backend_cache", "accepted; caches are named "
              "by sample id, checked against the files and reused by the next run"),
    **ignored("scan_for_errors", "accepted; every image's header is checked during discovery"),
    **ignored("aspect_bucket_rounding", NO_ASPECT_ROUNDING),
    **ignored("text_encoder_batch_size image_processing_batch_size max_workers vae_batch_size "
              "read_batch_size write_batch_size "
              "metadata_update_interval max_file_size parallel_downloads buffer_size "
              "shard_cache_gb", IO_ONLY),
    **refused("delete_unwanted_images delete_problematic_images delete_nsfw_images",
              NEVER_DELETED),
    **refused("caption_shuffle", "remove it; captions are used as written (multi-line files: "
              "one line per epoch)"),
    **refused("caption_file_extensions", "remove it; a caption is the .txt file beside the "
              "image"),
    **refused("max_upscale_threshold", "remove it; use minimum_image_size to skip images that "
              "would be upscaled"),
    **refused("timestep_sampling_offset", "remove it; every dataset draws timesteps the same "
              "way", (None, 0)),
}
