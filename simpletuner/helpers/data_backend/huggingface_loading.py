"""Opening a ``type: huggingface`` dataset with the datasets library, never over the network.

``dataset_name`` is a folder (``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, or data
files the library reads: parquet, an imagefolder, ...) or a Hub id that is already on this
machine: in the datasets cache (an earlier ``load_dataset``) or in the Hub cache (``hf download
--repo-type dataset``). The library is put in offline mode before it is asked anything, so a
dataset that is not here is an error saying how to download it, never a download.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from simpletuner.configuration.huggingface_block import HuggingFaceConfig

SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes


class HuggingFaceDatasetError(RuntimeError):
    """The dataset cannot be opened as configured; the message names the key and the fix."""


def _offline_datasets():
    """The datasets module, with its Hub access switched off (the trainer downloads nothing)."""
    import datasets  # the 'huggingface' extra

    datasets.config.HF_HUB_OFFLINE = True
    datasets.config.HF_DATASETS_OFFLINE = True
    return datasets


def open_split(config: HuggingFaceConfig):
    """The configured split as a ``datasets.Dataset``."""
    datasets = _offline_datasets()
    name = config.dataset_name
    if os.path.isdir(name):
        if any((Path(name) / marker).is_file() for marker in SAVED_MARKERS):
            loaded = datasets.load_from_disk(name)
        else:
            loaded = datasets.load_dataset(name, cache_dir=config.cache_dir)
    else:
        loaded = _from_a_cache(datasets, config)
    return _pick_split(datasets, loaded, config)


def _from_a_cache(datasets, config: HuggingFaceConfig):
    """A Hub id from the datasets cache, else from a Hub snapshot folder."""
    from huggingface_hub import snapshot_download

    name, revision = config.dataset_name, config.revision
    try:
        return datasets.load_dataset(name, revision=revision, cache_dir=config.cache_dir)
    except (ConnectionError, FileNotFoundError, ValueError):
        pass  # not in the datasets cache; the Hub cache is next
    try:
        folder = snapshot_download(name, repo_type="dataset", revision=revision,
                                   local_files_only=True)
    except FileNotFoundError as exc:  # huggingface_hub's LocalEntryNotFoundError
        raise HuggingFaceDatasetError(
            f"key 'dataset_name': {name!r} is no folder and is not downloaded (looked in the "
            f"datasets cache {config.cache_dir or datasets.config.HF_DATASETS_CACHE} and the "
            "Hub cache); nothing is downloaded at run time. Download it first: `hf download "
            f"--repo-type dataset {name}`{f' --revision {revision}' if revision else ''}, or "
            f"save it to a folder with datasets.load_dataset({name!r}).save_to_disk(FOLDER) "
            "and set dataset_name to that folder") from exc
    return datasets.load_dataset(folder, cache_dir=config.cache_dir)


def _pick_split(datasets, loaded, config: HuggingFaceConfig):
    if isinstance(loaded, datasets.DatasetDict):
        if config.split not in loaded:
            raise HuggingFaceDatasetError(
                f"key 'split': {config.split!r} is not a split of {config.dataset_name} (it has "
                f"{', '.join(loaded) or 'none'})")
        return loaded[config.split]
    saved_as = loaded.split  # a single Dataset: its split, if it recorded one
    if saved_as is not None and str(saved_as) != config.split:
        raise HuggingFaceDatasetError(
            f"key 'split': {config.dataset_name} holds the split {str(saved_as)!r}, not "
            f"{config.split!r}; set split to {str(saved_as)!r}")
    return loaded


def column_of(rows, name: str):
    """A column of an Arrow-formatted Dataset; 'a.b' is field b of struct column a. None when
    there is no such column."""
    import pyarrow
    import pyarrow.compute as pc

    if name in rows.column_names:
        return rows[name]
    head, _, rest = name.partition(".")
    if not rest or head not in rows.column_names:
        return None
    column = rows[head]
    for field in rest.split("."):
        if not pyarrow.types.is_struct(column.type) or column.type.get_field_index(field) < 0:
            return None
        column = pc.struct_field(column, field)
    return column


def column_problems(rows, config: HuggingFaceConfig, wants_captions: bool) -> list[str]:
    """Each configured column the split lacks, or whose type cannot be used."""
    import pyarrow

    where = f"{config.dataset_name} [{config.split}]"
    has = ", ".join(rows.column_names)
    problems = []
    image = column_of(rows, config.image_column)
    if image is None:
        problems.append(f"key 'image_column': no column {config.image_column!r} in {where} "
                        f"(it has {has})")
    elif not (pyarrow.types.is_binary(image.type) or pyarrow.types.is_large_binary(image.type)
              or pyarrow.types.is_struct(image.type)
              and image.type.get_field_index("bytes") >= 0):
        problems.append(f"key 'image_column': column {config.image_column!r} of {where} holds "
                        f"{image.type}, not images (an Image feature or bytes)")
    named = [("width_column", config.width_column), ("height_column", config.height_column)]
    if wants_captions:
        captions = config.caption_column
        named += [("caption_column", n) for n in ([captions] if isinstance(captions, str)
                                                  else captions)]
        named.append(("fallback_caption_column", config.fallback_caption_column))
    for key, name in named:
        if name is not None and column_of(rows, name) is None:
            problems.append(f"key 'huggingface.{key}': no column {name!r} in {where} "
                            f"(it has {has})")
    return problems


def dataset_problems(dataset) -> list[str]:
    """What ``python -m simpletuner check`` reports for one ``type: huggingface`` DatasetConfig:
    whether it opens, and has the configured split and columns."""
    config = dataset.huggingface_config()
    try:
        rows = open_split(config).with_format("arrow")
    except HuggingFaceDatasetError as exc:
        return [str(exc)]
    except (OSError, ValueError) as exc:  # the library's own: unreadable files, bad folders
        return [f"key 'dataset_name': {config.dataset_name} cannot be opened "
                f"({type(exc).__name__}: {exc})"]
    return column_problems(rows, config, dataset.caption_strategy == "huggingface")


def files_digest(rows) -> str:
    """Names the Arrow files a split was read from, by path, size and mtime: a dataset saved
    or converted again gets another digest, so its images are read and encoded again."""
    stats = []
    for entry in rows.cache_files:
        stat = os.stat(entry["filename"])
        stats.append([entry["filename"], stat.st_size, stat.st_mtime_ns])
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:32]
