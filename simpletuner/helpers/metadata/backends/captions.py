"""Captions known when the index is built, kept in the metadata cache beside it.

Two sources: a metadata table (caption_strategy 'parquet'), and caption files on remote
storage (caption_strategy 'textfile' on S3), fetched in parallel on the main rank so that no
rank pays one round trip per caption during caching or training. A caption file is fetched
again only when its size or ETag changed. Local caption files are read on demand instead.
"""

from __future__ import annotations

import posixpath
from bisect import bisect_left
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from simpletuner.helpers.data_backend.storage import ChangeKey, Listing, Storage, StorageError

MAX_THREADS = 64


class CaptionError(ValueError):
    """A caption file that exists but cannot be read as UTF-8 text; names the file."""


def caption_file_for(sample_id: str) -> str:
    """'a/b/img.jpg' -> 'a/b/img.txt'."""
    return posixpath.splitext(sample_id)[0] + ".txt"


@dataclass
class CaptionTable:
    """Captions as a column beside the file table's rows (None: no caption kept for that row),
    with the change key of the caption file each came from (``keys``: None for a table's).

    Aligned with the rows instead of keyed by sample id: the cache holds no second copy of a
    million ids, and loading it builds no dict (a lookup bisects the sorted id column)."""

    ids: list[str]                    # the file table's sorted id column (shared, not saved)
    texts: list[str | None]
    keys: list[ChangeKey | None] | None = None

    def _row(self, sample_id: str) -> int | None:
        row = bisect_left(self.ids, sample_id)
        return row if row < len(self.ids) and self.ids[row] == sample_id else None

    def text_of(self, sample_id: str) -> str | None:
        row = self._row(sample_id)
        return None if row is None else self.texts[row]

    def key_of(self, sample_id: str) -> ChangeKey | None:
        row = self._row(sample_id)
        return None if row is None or self.keys is None else self.keys[row]


def fetch_caption_files(storage: Storage, ids: list[str], rows: list[int], listing: Listing,
                        known: CaptionTable | None) -> CaptionTable:
    """The caption file of the sample in each of ``rows`` of ``ids`` (the listing must hold
    it), fetched in parallel; captions whose file is unchanged are taken from ``known``."""
    texts: list[str | None] = [None] * len(ids)
    keys: list[ChangeKey | None] = [None] * len(ids)
    todo: list[int] = []
    for row in rows:
        sample_id = ids[row]
        keys[row] = listing.captions[caption_file_for(sample_id)]
        old = known.text_of(sample_id) if known is not None else None
        if old is not None and known.key_of(sample_id) == keys[row]:
            texts[row] = old
        else:
            todo.append(row)
    threads = max(1, min(MAX_THREADS, storage.max_connections, len(todo)))
    with ThreadPoolExecutor(threads) as pool:
        for row, text in zip(todo, pool.map(lambda r: read_caption(storage, ids[r]), todo)):
            texts[row] = text
    return CaptionTable(ids, texts, keys)


def read_caption(storage: Storage, sample_id: str) -> str:
    """The caption text of ``sample_id``, or a CaptionError naming the file and the fix."""
    name = caption_file_for(sample_id)
    try:
        data = storage.read_bytes(name)
    except StorageError:
        raise  # the storage failed, not this file: its message says what to do
    except OSError as exc:
        raise CaptionError(f"caption file {storage.identity(name)} cannot be read "
                           f"({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise CaptionError(
            f"caption file {storage.identity(name)} is not UTF-8 text (byte "
            f"{exc.object[exc.start]:#04x} at position {exc.start}); re-save it as UTF-8 (e.g. "
            "with `iconv -f latin1 -t utf-8`) and rerun") from exc