"""SimpleTuner's ``text_embeds`` and ``image_embeds`` entries of multidatabackend.json.

In SimpleTuner these entries say where embeddings are cached rather than describing images. Here
a ``text_embeds`` entry's ``cache_dir`` becomes the text-embedding cache folder of every image
dataset that names it (``"text_embeds": "<id>"``), or of all of them when it is the ``default``
(or the only one). An ``image_embeds`` entry names the storage of VAE latents; with local storage
it changes nothing here (latents go to each dataset's ``cache_dir_vae``), so it is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.fields import option, parse_fields
from simpletuner.configuration.simpletuner_options import MULTIDATABACKEND_JSON

EMBED_DATASET_TYPES = ("text_embeds", "image_embeds")


@dataclass
class EmbedCacheEntry:
    id: str = option(required=True)
    dataset_type: Literal["text_embeds", "image_embeds"] = option(required=True)
    type: Literal["local"] = option("local", help="storage backend; only 'local' is supported")
    disabled: bool = option(False)
    default: bool = option(False, help="text_embeds: used by datasets that name no entry")
    cache_dir: str | None = option(None, help="text_embeds: the text-embedding cache folder")
    write_batch_size: int | None = option(
        None, minimum=1, help="accepted for SimpleTuner configs; embeddings are written one file "
        "per caption here, so it has no effect")


def is_embed_entry(item: Any) -> bool:
    return isinstance(item, dict) and item.get("dataset_type") in EMBED_DATASET_TYPES


def parse_embed_entry(item: dict, label: Location,
                      problems: list[Problem]) -> EmbedCacheEntry | None:
    before = len(problems)
    values = parse_fields(EmbedCacheEntry, item, label, problems, MULTIDATABACKEND_JSON)
    if len(problems) > before:
        return None
    entry = EmbedCacheEntry(**values)
    if entry.dataset_type == "image_embeds" and entry.cache_dir is not None:
        problems.append(label.problem(
            "cache_dir", "key 'cache_dir' has no meaning on an image_embeds entry; set "
            "cache_dir_vae on the image datasets (as in SimpleTuner)"))
        return None
    if entry.dataset_type == "text_embeds" and entry.cache_dir is None and not entry.disabled:
        problems.append(label.problem(
            "cache_dir", "key 'cache_dir' is required on a text_embeds entry (the folder its "
            "embeddings are cached in)"))
        return None
    return entry


def apply_embed_entries(datasets: list[DatasetConfig], entries: list[EmbedCacheEntry],
                        where: Location, problems: list[Problem]) -> list[DatasetConfig]:
    """Give each image dataset the text-embedding folder its text_embeds entry names."""
    by_id = {e.id: e for e in entries if not e.disabled}
    text = [e for e in by_id.values() if e.dataset_type == "text_embeds"]
    defaults = [e for e in text if e.default] or (text if len(text) == 1 else [])
    if len(defaults) > 1:
        problems.append(where.problem(
            "", "more than one text_embeds entry has 'default': true "
            f"({', '.join(e.id for e in defaults)}); mark one"))
        return datasets
    for name, kind in (("text_embeds", "text_embeds"), ("image_embeds", "image_embeds")):
        for ds in datasets:
            wanted = getattr(ds, name)
            if wanted is not None and (wanted not in by_id or by_id[wanted].dataset_type != kind):
                problems.append(where.entry(ds.id).problem(
                    name, f"dataset '{ds.id}': key '{name}' names '{wanted}', which is no "
                    f"enabled {kind} entry"))
    updated = []
    for ds in datasets:
        entry = by_id.get(ds.text_embeds) if ds.text_embeds else (defaults[0] if defaults else None)
        if ds.cache_dir is None and entry is not None and entry.dataset_type == "text_embeds":
            ds = replace(ds, cache_dir=entry.cache_dir)
        updated.append(ds)
    return updated
