"""Captions known when the index is built, kept in the metadata cache beside it.

Two sources: a metadata table (caption_strategy 'parquet'), and caption files on remote
storage (caption_strategy 'textfile' on S3), fetched in parallel on the main rank so that no
rank pays one round trip per caption during caching or training. A caption file is fetched
again only when its size or ETag changed. Local caption files are read on demand instead.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from simpletuner.helpers.data_backend.storage import ChangeKey, Listing, Storage

MAX_THREADS = 64


def caption_file_for(sample_id: str) -> str:
    """'a/b/img.jpg' -> 'a/b/img.txt'."""
    return posixpath.splitext(sample_id)[0] + ".txt"


@dataclass
class CaptionTable:
    """sample id -> caption text, with the change key of the file it came from (None: from a
    table). Stored as columns, like the file table, in the order the builder inserted them
    (deterministic: table rows, or index order), so a million captions are not sorted again."""

    texts: dict[str, str] = field(default_factory=dict)
    keys: dict[str, ChangeKey | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        ids = list(self.texts)
        return {"ids": ids, "texts": list(self.texts.values()),
                "keys": [self.keys.get(i) for i in ids]}

    @classmethod
    def from_json(cls, data: Any) -> "CaptionTable | None":
        """None when ``data`` is not a table this code wrote."""
        if not isinstance(data, dict):
            return None
        ids, texts, keys = data.get("ids"), data.get("texts"), data.get("keys")
        if not all(isinstance(c, list) for c in (ids, texts, keys)) or not (
                len(ids) == len(texts) == len(keys)):
            return None
        return cls(dict(zip(ids, texts)), dict(zip(ids, keys)))


def fetch_caption_files(storage: Storage, sample_ids: list[str], listing: Listing,
                        known: CaptionTable) -> CaptionTable:
    """The caption file of each sample (which the listing must hold), reusing unchanged ones."""
    table = CaptionTable()
    todo: list[tuple[str, ChangeKey | None]] = []
    for sample_id in sample_ids:
        key = listing.captions[caption_file_for(sample_id)]
        if sample_id in known.texts and known.keys.get(sample_id) == key:
            table.texts[sample_id], table.keys[sample_id] = known.texts[sample_id], key
        else:
            todo.append((sample_id, key))
    threads = max(1, min(MAX_THREADS, storage.max_connections, len(todo)))
    with ThreadPoolExecutor(threads) as pool:
        texts = pool.map(lambda item: read_caption(storage, item[0]), todo)
        for (sample_id, key), text in zip(todo, texts):
            table.texts[sample_id], table.keys[sample_id] = text, key
    return table


def read_caption(storage: Storage, sample_id: str) -> str:
    name = caption_file_for(sample_id)
    data = storage.read_bytes(name)
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ValueError(f"caption file {storage.identity(name)} is not UTF-8 text ({exc}); "
                         "save it as UTF-8") from exc
