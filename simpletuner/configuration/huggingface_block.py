"""``type: huggingface``: SimpleTuner's keys for a dataset read through the ``datasets`` library.

SimpleTuner reads ``dataset_name``, ``split``, ``revision``, ``image_column`` (and here
``caption_column``) at the top of the entry or inside its ``huggingface`` block, the top one
winning; here both are accepted and a disagreement between them is reported. The merged,
checked keys are kept as the entry's ``huggingface`` dict (``DatasetConfig.huggingface_config``).
Parts of the block that ask for something not built here are refused by name, with advice.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.fields import option, parse_fields
from simpletuner.configuration.simpletuner_keys.datasets import ONE_PASS, PREFILTER
from simpletuner.configuration.simpletuner_keys.entries import Foreign
from simpletuner.configuration.simpletuner_options import SimpleTunerVocabulary

# Keys SimpleTuner takes at the top of the entry or in the block.
SHARED_KEYS = ("dataset_name", "split", "revision", "image_column", "caption_column")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
NOT_IMAGES = "remove it; only image datasets are read here"
_BLOCK_KEYS = {
    "filter_func": PREFILTER, "quality_column": PREFILTER,
    "num_proc": ONE_PASS,
    "description_column": "use fallback_caption_column",
    "bbox_column": "remove it; grounding boxes are not read here",
    "video_column": NOT_IMAGES, "num_frames_column": NOT_IMAGES, "fps_column": NOT_IMAGES,
    "lyrics_column": NOT_IMAGES, "audio_caption_fields": NOT_IMAGES,
}
BLOCK_VOCABULARY = SimpleTunerVocabulary(
    {key: Foreign(advice) for key, advice in _BLOCK_KEYS.items()}, {})


@dataclass
class HuggingFaceConfig:
    """The ``huggingface`` block, with the entry's own dataset_name ... caption_column."""

    dataset_name: str = option(
        required=True, help="a folder (Dataset.save_to_disk, parquet files, an imagefolder) or "
        "a Hub id already downloaded; nothing is downloaded at run time")
    split: str = option("train", help="the split to train on; sample ids are '<split>/<row>'")
    revision: str | None = option(None, help="the Hub revision that was downloaded")
    image_column: str = option("image", help="an Image feature or bytes")
    caption_column: str | list[str] = option(
        "caption", help="for caption_strategy 'huggingface'; a column of text or of lists of "
        "text, or a list of columns: every non-empty value is one of the sample's captions, "
        "one per epoch (as the lines of a caption file); 'a.b' names field b of struct a")
    fallback_caption_column: str | None = option(None, help="used where caption_column is empty")
    width_column: str | None = option(
        None, help="with height_column: sizes from these columns, no image is opened; unset: "
        "from each image's header")
    height_column: str | None = option(None, help="pixels as displayed (after EXIF rotation)")
    cache_dir: str | None = option(
        None, help="the datasets cache (where load_dataset keeps its Arrow files); none: "
        "HF_DATASETS_CACHE or ~/.cache/huggingface/datasets")
    streaming: bool = option(False, help="only false: every row is indexed before training")
    composite_image_config: dict | None = option(
        None, help="only {\"enabled\": false}: grids are not split here")
    file_extension: str | None = option(
        None, help="accepted, no effect: SimpleTuner's virtual file names; ids here are "
        "'<split>/<row>'")
    auto_load: bool | None = option(None, help="accepted, no effect: opened when first needed")


def is_local_name(name: str, base: Path) -> bool:
    """A folder (existing, or written as a path) rather than a Hub id 'namespace/name'."""
    return (base / os.path.expanduser(name)).is_dir() or not HUB_ID.match(name)


def parse_huggingface_block(values: dict[str, Any], where: Location,
                            problems: list[Problem]) -> dict[str, Any] | None:
    """The entry's top-level keys merged with its ``huggingface`` block, checked; None after
    appending what is wrong."""
    before = len(problems)
    block = parse_fields(HuggingFaceConfig, values.get("huggingface") or {},
                         where.within("huggingface", "key 'huggingface'"), problems,
                         BLOCK_VOCABULARY, check_required=False)
    for key in SHARED_KEYS:
        top = values.get(key)
        if top is not None and key in block and block[key] != top:
            problems.append(where.problem(
                key, f"key '{key}' is {top!r} but huggingface.{key} is {block[key]!r}; give it "
                "once"))
        elif top is not None:
            block[key] = top
    if not block.get("dataset_name"):
        problems.append(where.problem(
            "dataset_name", "type 'huggingface' needs 'dataset_name' (a dataset folder, or a Hub "
            "id already downloaded)"))
    if block.get("streaming"):
        problems.append(where.problem(
            "huggingface.streaming", "key 'huggingface': streaming is not supported: every row "
            "is indexed before training; remove it"))
    composite = block.get("composite_image_config")
    if composite and composite.get("enabled"):
        problems.append(where.problem(
            "huggingface.composite_image_config", "key 'huggingface': composite_image_config is "
            "not supported; split the grids into single images first (and save_to_disk), or set "
            "enabled false"))
    if (block.get("width_column") is None) != (block.get("height_column") is None):
        problems.append(where.problem(
            "huggingface.width_column", "key 'huggingface': width_column and height_column are "
            "given together (or neither, to read each image's header)"))
    return block if len(problems) == before else None


def check_huggingface_keys(ds, where: Location, base: Path, problems: list[Problem]) -> None:
    """Which keys go with which type; a dataset folder that is written as a path must exist."""
    given = [key for key in (*SHARED_KEYS, "huggingface") if getattr(ds, key) is not None]
    if ds.type != "huggingface":
        if given:
            problems.append(where.problem(
                given[0], f"key {', '.join(map(repr, given))} is for type 'huggingface' only (a "
                "table's columns go in the parquet block)"))
        if ds.caption_strategy == "huggingface" or ds.metadata_backend == "huggingface":
            problems.append(where.problem(
                "caption_strategy", "caption_strategy and metadata_backend 'huggingface' need "
                "type 'huggingface'"))
        return
    if ds.caption_strategy not in ("huggingface", "instanceprompt"):
        problems.append(where.problem(
            "caption_strategy", "type 'huggingface' takes caption_strategy 'huggingface' (the "
            f"caption_column) or 'instanceprompt'; found {ds.caption_strategy!r}"))
    if ds.metadata_backend == "parquet":
        problems.append(where.problem(
            "metadata_backend", "type 'huggingface' reads sizes from its rows; remove "
            "metadata_backend 'parquet' (or set 'huggingface')"))
    if ds.instance_data_dir is not None:
        problems.append(where.problem(
            "instance_data_dir", "type 'huggingface' reads no instance_data_dir; remove it"))
    name = (ds.huggingface or {}).get("dataset_name")
    if name and not ds.disabled and is_local_name(name, base):
        folder = base / os.path.expanduser(name)
        if not folder.is_dir():
            problems.append(where.problem(
                "huggingface.dataset_name", f"key 'dataset_name': folder {folder} does not exist"))


def with_absolute_paths(block: dict[str, Any], base: Path) -> dict[str, Any]:
    """Folders relative to the working directory, as SimpleTuner reads them; Hub ids as given."""
    block = dict(block)
    if is_local_name(block["dataset_name"], base):
        block["dataset_name"] = str((base / os.path.expanduser(block["dataset_name"])).resolve())
    if block.get("cache_dir"):
        block["cache_dir"] = str((base / os.path.expanduser(block["cache_dir"])).resolve())
    return block
