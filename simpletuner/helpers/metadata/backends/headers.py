"""Metadata backend 'discovery': image sizes from headers, read only for new or changed files.

Local folders are read by worker processes (probe_pool.py). Remote objects are read with
ranged GETs on threads (a request is network wait, which threads overlap well): the first
HEAD_READS bytes, more only if the header goes on, the whole object as the last resort.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from PIL import Image
from tqdm import tqdm

from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends import probe_pool
from simpletuner.helpers.metadata.backends.discovery import BAD_HEADER, VANISHED, Probe, probe_head
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import SkippedFile, SkippedFiles
from simpletuner.helpers.metadata.index_columns import StringColumn

HEAD_READS = (8 * 1024, 128 * 1024)  # a JPEG's EXIF block may push its size past 8 KiB
MAX_THREADS = 64


@dataclass
class FoundFiles:
    """What a metadata source made of a listing."""

    files: FileTable                 # one row per listed image, sizes filled in
    read: int                        # files whose bytes were read
    forgotten: int                   # rows of the old table whose file is gone
    # skips beyond the rows' own errors (a table's: columns)
    skipped: list[SkippedFile] | SkippedFiles = field(default_factory=list)
    captions: list[str | None] | None = None   # a caption per row of ``files``, if known
    id_column: StringColumn | None = None  # ``files.ids`` encoded, where the source needed that
    # The source added the file table's columns (and its captions') to the index cache version
    # it was given itself, each as soon as it was known, so they went to disk while it read.
    stored: bool = False
    tabled: int = 0  # files sized by a table's or dataset's columns: neither read nor cached


class HeaderSource:
    """``metadata_backend: discovery``."""

    def __init__(self, storage: Storage, dataset_id: str):
        self.storage = storage
        self.dataset_id = dataset_id

    def key(self) -> dict:
        return {"metadata_backend": "discovery"}

    def unchanged(self, listing: Listing, cached: object) -> bool:
        """Never: whether a caption file exists decides skips too, and it is not in ``cached``
        (the index cache's LoadedIndex)."""
        return False

    def read(self, listing: Listing, known: FileTable, show_progress: bool,
             store=None) -> FoundFiles:
        # store: unused; base adds the columns of what this returns (FoundFiles.stored)
        files, stale, forgotten = known.reconcile(listing)
        names = [files.ids[row] for row in stale]
        description = f"{self.dataset_id}: reading image headers"
        show = show_progress and bool(stale)
        if self.storage.remote:
            probes = probe_objects(self.storage, names, [files.sizes[row] for row in stale],
                                   max_pixels=Image.MAX_IMAGE_PIXELS, show_progress=show,
                                   description=description)
        else:
            probes = probe_pool.probe_images(
                [str(self.storage.local_path(name)) for name in names],
                max_pixels=Image.MAX_IMAGE_PIXELS, show_progress=show, description=description)
        for row, probe in zip(stale, probes):
            files.record(row, probe)
        return FoundFiles(files, len(stale), forgotten)


def probe_objects(storage: Storage, names: list[str], sizes: list[int], *,
                  max_pixels: int | None, show_progress: bool = False,
                  description: str = "reading image headers") -> list[Probe]:
    """Probe every remote object, in parallel; results are in the order of ``names``. A
    storage error (refused, throttled past its retries) is raised, not recorded per file."""
    threads = max(1, min(MAX_THREADS, storage.max_connections, len(names)))
    with ThreadPoolExecutor(threads) as pool, tqdm(total=len(names), desc=description,
                                                   unit="img", disable=not show_progress) as bar:
        def one(name_and_size: tuple[str, int]) -> Probe:
            probe = probe_object(storage, *name_and_size, max_pixels=max_pixels)
            bar.update(1)
            return probe

        return list(pool.map(one, zip(names, sizes)))


def probe_object(storage: Storage, name: str, size: int, *, max_pixels: int | None) -> Probe:
    """The object's size from as few leading bytes as its header needs."""
    for length in (*HEAD_READS, size):
        length = min(length, size)
        try:
            head = storage.read_range(name, 0, length) if length else b""
        except FileNotFoundError:
            return Probe(error=VANISHED)
        found = probe_head(head, size, max_pixels)
        if found is not None:
            return found
        if length >= size:
            break
    return Probe(error=BAD_HEADER)
