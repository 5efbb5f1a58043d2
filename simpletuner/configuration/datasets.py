"""multidatabackend.json: one object per dataset, with SimpleTuner's keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simpletuner.configuration.fields import option


@dataclass
class DatasetConfig:
    id: str = option(required=True, help="unique, safe for file names")
    type: str = option("local", help="storage backend; only 'local' is supported")
    dataset_type: Literal["image", "eval"] = option("image")
    disabled: bool = option(False)
    instance_data_dir: str = option(required=True)
    # None = inherit from config.json
    resolution: float | None = option(None, minimum=0.0001)
    resolution_type: Literal["pixel", "area", "pixel_area"] | None = option(
        None, help="pixel_area: resolution in pixels, trained at that area (resolution**2)")
    minimum_image_size: float | None = option(None, minimum=0.0)
    maximum_image_size: float | None = option(None, minimum=0.0)
    minimum_aspect_ratio: float | None = option(None, minimum=0.0)
    maximum_aspect_ratio: float | None = option(None, minimum=0.0)
    crop: bool = option(False)
    crop_style: Literal["center", "random", "corner"] = option(
        "center", help="corner: keep the bottom-right part (SimpleTuner's corner crop)")
    crop_aspect: Literal["preserve", "square", "closest"] = option(
        "preserve", help="closest: crop to the aspect (W/H) in crop_aspect_buckets nearest the "
        "image's")
    caption_strategy: Literal["textfile", "filename", "instanceprompt"] = option("textfile")
    instance_prompt: str | None = option(None)
    repeats: int = option(0, minimum=0, help="0 = each sample once per epoch")
    train_batch_size: int | None = option(None, minimum=1, help="overrides config.json")
    cache_dir_vae: str | None = option(None)
    cache_dir: str | None = option(None, help="this dataset's text-embedding cache folder; "
                                   "none = the text_embeds entry's, else output_dir/cache/text")

    # SimpleTuner compatibility (issue 15): references to text_embeds / image_embeds entries
    text_embeds: str | None = option(None, help="id of the text_embeds entry whose cache_dir "
                                     "holds this dataset's text embeddings; none = the default")
    image_embeds: str | None = option(None, help="id of an image_embeds entry (local storage: "
                                      "latents go to cache_dir_vae)")
    caption_dropout_probability: float | None = option(
        None, minimum=0.0, maximum=1.0, help="overrides config.json's for this dataset")
    disable_multiline_split: bool = option(
        False, help="true: a caption file's lines form one caption; false: one line per epoch")
    prepend_instance_prompt: bool = option(False, help="instance_prompt + ' ' + each caption")
    only_instance_prompt: bool = option(
        False, help="train every sample with instance_prompt (caption_strategy 'textfile' still "
        "needs the caption files; 'instanceprompt' needs none)")
    crop_aspect_buckets: list[float] | None = option(
        None, help="aspect ratios (W/H) for crop_aspect 'closest', e.g. [0.75, 1.0, 1.5]")
    max_num_samples: int | None = option(
        None, minimum=1, help="keep this many samples: a fixed subset chosen by a digest of "
        "(dataset id, sample id), the same on every rank and run")
