"""multidatabackend.json: one object per dataset, with SimpleTuner's keys."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.fields import option, parse_fields
from simpletuner.configuration.huggingface_block import HuggingFaceConfig
from simpletuner.configuration.options import BucketTail
from simpletuner.configuration.video_block import VideoSettings
from simpletuner.dataset_kinds import kind_names, kind_of

DatasetType = Literal[kind_names()]  # one module each in simpletuner/dataset_kinds/
STORAGE_TYPES = ("local", "aws", "huggingface")
TABLE_SUFFIXES = (".parquet", ".jsonl")
# SimpleTuner's weighted crop_aspect_buckets entry: {"aspect_bucket": 1.5, "weight": 0.25}
ASPECT_KEY, WEIGHT_KEY = "aspect_bucket", "weight"
# storage type / metadata backend -> (module it needs, the extra that brings it); a dataset
# kind names its own (DatasetKind.needs)
_EXTRAS = {"aws": ("boto3", "s3"), "parquet": ("pyarrow", "parquet"),
           "huggingface": ("datasets", "huggingface")}


@dataclass
class ParquetConfig:
    """The ``parquet`` block of ``metadata_backend: parquet`` (a .parquet or .jsonl table)."""

    path: str = option(required=True, help="the table; relative to the working directory")
    filename_column: str = option("filename", help="the file's path within the storage")
    caption_column: str | None = option(None, help="read for caption_strategy 'parquet'")
    fallback_caption_column: str | None = option(None, help="used where caption_column is empty")
    width_column: str = option("width", help="pixels as displayed (after EXIF rotation)")
    height_column: str = option("height", help="pixels as displayed (after EXIF rotation)")
    identifier_includes_extension: bool = option(True, help="false: 'a/img' names 'a/img.png'")
    trust_table: bool = option(
        False, help="true: the table is the file list, the storage is not listed (for buckets "
        "where listing is slow); a missing image is dropped when its latent is cached, a "
        "changed one is not re-encoded")


@dataclass
class DatasetConfig:
    id: str = option(required=True, help="unique, safe for file names")
    type: str = option("local", help="storage backend: 'local' (a folder), 'aws' (S3-compatible) "
                       "or 'huggingface' (a dataset read with the datasets library)")
    dataset_type: DatasetType = option(
        "image", help="'video': clips (.mp4, .webm, .mkv, .mov, .avi), read with PyAV; their "
        "frames are set by the video block; 'conditioning': reference images of the dataset "
        "whose conditioning_data names this one, matched to its targets by path")
    disabled: bool = option(False)
    conditioning_data: str | list[str] | None = option(
        None, help="edit training (flux kontext, qwen_image edit-v1/v2): the id(s) of the "
        "'conditioning' dataset(s) "
        "holding each sample's reference image, the file with the same path and stem; masked "
        "loss (any model): the id of the 'mask' conditioning dataset")
    conditioning_type: Literal["reference_strict", "reference_loose", "mask",
                               "controlnet"] | None = option(
        None, help="a 'conditioning' dataset (set, it makes one, as in SimpleTuner): "
        "'reference_strict' resizes each reference to its target's size and crops it the same "
        "way; 'reference_loose' fits it to its own aspect bucket (train_batch_size 1); 'mask': "
        "each target's loss mask (red channel, white trains, black is ignored), fitted and "
        "cropped as its target; the target's pixels are blended to grey where the mask is "
        "black before encoding, so what is masked out never reaches the model; 'controlnet' "
        "(with controlnet: true): each target's control image, fitted and cropped as its "
        "target")
    conditioning: dict | list[dict] | None = option(
        None, help="SimpleTuner's generated conditioning: a block (or a list of them) "
        "{'type': 'canny', 'low_threshold': 100, 'high_threshold': 200, 'conditioning_type': "
        "'controlnet'} makes the conditioning dataset '<id>_conditioning_canny' of this "
        "dataset's own images' Canny edges (white on black), generated from each fitted "
        "target and cached once, and names it in conditioning_data")
    instance_data_dir: str | None = option(None, help="the folder; required for type 'local'")
    # type 'aws': SimpleTuner's keys. Credentials left out come from AWS_* or ~/.aws/.
    aws_bucket_name: str | None = option(None)
    aws_data_prefix: str = option("", help="the dataset is the keys under this prefix")
    aws_endpoint_url: str | None = option(None, help="R2, B2, MinIO, ...; None = AWS")
    aws_region_name: str | None = option(None)
    aws_access_key_id: str | None = option(None, secret=True)
    aws_secret_access_key: str | None = option(None, secret=True)
    aws_session_token: str | None = option(None, secret=True)
    aws_max_pool_connections: int = option(128, minimum=1, help="parallel requests")
    aws_retry_window_seconds: float = option(
        90.0, minimum=0.0, help="how long a request that fails for a passing reason (server "
        "down or restarting, dropped connection, throttling, 5xx) is retried with backoff; "
        "then the run stops with the error, never skipping the image")
    metadata_backend: Literal["discovery", "parquet", "huggingface"] = option(
        "discovery", help="'discovery' reads image headers; 'parquet' reads sizes from a table; "
        "'huggingface' (type 'huggingface', its default): from the rows")
    parquet: dict | None = option(None, help="the table's path and columns (the parquet block)")
    video: dict | None = option(None, help="dataset_type 'video': the frames clips train at "
                                "(the video block)")
    # type 'huggingface': SimpleTuner's keys, here or in its huggingface block
    dataset_name: str | None = option(None, help="type 'huggingface': a dataset folder or a "
                                      "downloaded Hub id (huggingface.dataset_name)")
    split: str | None = option(None, help="type 'huggingface': huggingface.split")
    revision: str | None = option(None, help="type 'huggingface': huggingface.revision")
    image_column: str | None = option(None, help="type 'huggingface': huggingface.image_column")
    caption_column: str | list[str] | None = option(
        None, help="type 'huggingface': huggingface.caption_column")
    huggingface: dict | None = option(None, help="type 'huggingface': the dataset's columns "
                                      "and cache (the huggingface block)")
    # None = inherit from config.json
    resolution: float | None = option(None, minimum=0.0001)
    resolution_type: Literal["pixel", "area", "pixel_area"] | None = option(
        None, help="pixel_area: resolution in pixels, trained at that area (resolution**2)")
    minimum_image_size: float | None = option(None, minimum=0.0)
    maximum_image_size: float | None = option(
        None, minimum=0.0, help="skip larger images; with target_downsample_size (as in "
        "SimpleTuner) a cropped image above it is downsampled to that size first instead")
    target_downsample_size: float | None = option(
        None, minimum=0.0, help="with maximum_image_size and crop: the size larger images are "
        "scaled to before the crop is cut (resolution units); none = crop from the image scaled "
        "to just cover its bucket")
    minimum_aspect_ratio: float | None = option(
        None, minimum=0.0, help="skip images whose aspect (W/H) is below this; none or 0: 1/8 "
        "(no limit when maximum_aspect_ratio is below 1/8)")
    maximum_aspect_ratio: float | None = option(
        None, minimum=0.0, help="skip images whose aspect (W/H) is above this; none or 0: 8 (no "
        "limit when minimum_aspect_ratio is above 8). Whatever the limits, an image whose "
        "bucket would hold more than 16x the training area is skipped")
    crop: bool = option(False)
    crop_style: Literal["center", "random", "corner"] = option(
        "center", help="corner: keep the bottom-right part (SimpleTuner's corner crop)")
    crop_aspect: Literal["preserve", "square", "closest", "random"] = option(
        "preserve", help="closest: crop to the aspect (W/H) in crop_aspect_buckets nearest the "
        "image's; random: to one drawn per sample by weight from a digest of (dataset id, "
        "sample id), so the same on every rank, run and resume")
    caption_strategy: Literal["textfile", "filename", "instanceprompt", "parquet",
                              "huggingface"] = option(
        "textfile", help="'parquet': the caption columns of the metadata table; 'huggingface' "
        "(type 'huggingface', its default): the dataset's caption_column")
    instance_prompt: str | None = option(None)
    repeats: int = option(0, minimum=0, help="0 = each sample once per epoch")
    train_batch_size: int | None = option(None, minimum=1, help="overrides config.json")
    bucket_tail: BucketTail | None = option(
        None, help="carry or trim, overrides config.json's bucket_tail (see there); training "
        "datasets only")
    cache_dir_vae: str | None = option(None, help="latents; default <output_dir>/cache/vae/<id>")
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
    crop_aspect_buckets: list[float | dict] | None = option(
        None, help="aspect ratios (W/H) for crop_aspect 'closest' or 'random', e.g. [0.75, 1.0, "
        "1.5]; for 'random' an entry may be {\"aspect_bucket\": 1.5, \"weight\": 2} (relative "
        "weights; a plain number weighs 1)")
    # Scheduling and prior preservation: SimpleTuner's keys (helpers/multiaspect/dataset_schedule.py)
    probability: float = option(
        1.0, minimum=0.0, maximum=1.0, help="above 0: relative odds of drawing this "
        "dataset's buckets for each next optimizer step among the steps the epoch still holds; "
        "every sample is still trained once per pass (training datasets)")
    start_epoch: int = option(1, minimum=0, help="the epoch (from 1) this dataset joins the "
                              "schedule at; 0 and 1: the first")
    start_step: int = option(0, minimum=0, help="the optimizer step (from 1) from which this "
                             "dataset is drawn, joining that epoch with its whole pass; 0 and "
                             "1: the first")
    end_epoch: int | None = option(None, minimum=0, help="the last epoch (from 1) this dataset "
                                   "is drawn in; null or 0: no end")
    end_step: int | None = option(None, minimum=0, help="the last optimizer step (from 1) this "
                                  "dataset is drawn at; the rest of that pass is not trained; "
                                  "null or 0: no end")
    is_regularisation_data: bool = option(
        False, help="prior preservation (model_type lora): the target of this dataset's samples "
        "is the base model's prediction (the adapter turned off), weighted like every other "
        "sample, as in SimpleTuner")
    max_num_samples: int | None = option(
        None, minimum=1, help="keep this many samples: a fixed subset chosen by a digest of "
        "(dataset id, sample id), the same on every rank and run")

    @property
    def is_mask(self) -> bool:
        """A conditioning dataset of loss masks (conditioning_type 'mask')."""
        return self.conditioning_type == "mask"

    @property
    def is_control(self) -> bool:
        """A conditioning dataset of ControlNet control images (conditioning_type 'controlnet')."""
        return self.conditioning_type == "controlnet"

    def conditioning_ids(self) -> list[str]:
        """conditioning_data as a list, in the order the model receives the references."""
        if self.conditioning_data is None:
            return []
        return ([self.conditioning_data] if isinstance(self.conditioning_data, str)
                else list(self.conditioning_data))

    def weighted_crop_aspects(self) -> list[tuple[float, float]]:
        """crop_aspect_buckets as (aspect, weight) pairs, as checked by dataset_checks.py."""
        return [(float(entry[ASPECT_KEY]), float(entry[WEIGHT_KEY])) if isinstance(entry, dict)
                else (entry, 1.0) for entry in self.crop_aspect_buckets or ()]

    def huggingface_config(self) -> HuggingFaceConfig:
        """The merged, checked ``huggingface`` block (type 'huggingface')."""
        return HuggingFaceConfig(**(self.huggingface or {}))

    def video_settings(self, model_family: str, framerate: int | None = None) -> VideoSettings:
        """The checked ``video`` block with its defaults, for a ``dataset_type: video`` dataset
        (``framerate``: config.json's, for the default num_frames)."""
        return VideoSettings.for_dataset(self.video, model_family, framerate)

    def parquet_config(self) -> ParquetConfig:
        """The checked ``parquet`` block (the loader reported any problem in it)."""
        return ParquetConfig(**(self.parquet or {}))


def parse_parquet_block(raw: Any, where: Location, problems: list[Problem]) -> dict | None:
    """The accepted ``parquet`` block, or None after appending what is wrong with it."""
    where = where.within("parquet", "key 'parquet'")
    if not isinstance(raw, dict):
        problems.append(where.problem(
            "", "metadata_backend 'parquet' needs a 'parquet' object with at least 'path' (the "
            ".parquet or .jsonl table)"))
        return None
    before = len(problems)
    values = parse_fields(ParquetConfig, raw, where, problems)
    if "path" in values and not values["path"].lower().endswith(TABLE_SUFFIXES):
        problems.append(where.problem(
            "path", f"'path' is {values['path']!r}; expected a .parquet or .jsonl file"))
    return values if len(problems) == before else None


def check_storage_keys(ds: DatasetConfig, where: Location, problems: list[Problem]) -> None:
    """Keys that only make sense together, and extras a choice needs, before heavy work."""
    if ds.type == "aws" and not ds.aws_bucket_name:
        problems.append(where.problem(
            "aws_bucket_name", "key 'aws_bucket_name' is required for type 'aws'"))
    if ds.type == "local" and ds.instance_data_dir is None:
        problems.append(where.problem(
            "instance_data_dir", "missing required key 'instance_data_dir' (or use type 'aws' "
            "with aws_bucket_name)"))
    if ds.caption_strategy == "parquet" and ds.metadata_backend != "parquet":
        problems.append(where.problem(
            "caption_strategy", "caption_strategy 'parquet' takes captions from the metadata "
            "table; set metadata_backend 'parquet' and its 'parquet' block"))
    if (ds.caption_strategy == "parquet" and isinstance(ds.parquet, dict)
            and not ds.parquet.get("caption_column")):
        problems.append(where.problem(
            "parquet.caption_column", "caption_strategy 'parquet' needs parquet.caption_column"))
    if ds.metadata_backend == "parquet" and isinstance(ds.parquet, dict) and ds.parquet.get(
            "trust_table"):
        if ds.caption_strategy == "textfile":
            problems.append(where.problem(
                "parquet.trust_table", "parquet.trust_table does not list the storage, so "
                "caption files cannot be found; use caption_strategy 'parquet' (or 'filename', "
                "'instanceprompt'), or set trust_table false"))
        if ds.parquet.get("identifier_includes_extension") is False:
            problems.append(where.problem(
                "parquet.trust_table", "parquet.trust_table needs file names with their "
                "extension (identifier_includes_extension true): without a listing nothing says "
                "which file 'a/img' is"))
    # type huggingface names both of the first two
    needs = kind_of(ds).needs  # a dataset kind's own extra (video: PyAV)
    extras = {**_EXTRAS, **({ds.dataset_type: needs} if needs else {})}
    for choice in dict.fromkeys((ds.type, ds.metadata_backend, ds.dataset_type)):
        if choice in extras and importlib.util.find_spec(extras[choice][0]) is None:
            module, extra = extras[choice]
            key = next(k for k in ("type", "metadata_backend", "dataset_type")
                       if getattr(ds, k) == choice)
            problems.append(where.problem(
                key, f"'{choice}' needs {module}, which is not installed; run pip install "
                f"'simpletuner[{extra}]'"))
