"""Metadata backend 'huggingface': the sizes and captions of a datasets-library split's rows.

Sizes come from ``width_column`` / ``height_column`` when they are configured (Arrow columns,
no image opened, as a parquet table's), else from each image's header read from its bytes
(only for rows that are new or changed since the cached index). Captions come from
``caption_column``: a text column, a column of lists of text, or several columns; every
non-empty value is one of the sample's captions (its "lines": one per epoch, as a multi-line
caption file's), ``fallback_caption_column`` where there is none. The result is the FileTable
every other source gives, so the index, its cache and everything after it are one code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from PIL import Image
from tqdm import tqdm

from simpletuner.helpers.data_backend.huggingface import HuggingFaceStorage
from simpletuner.helpers.data_backend.huggingface_loading import (
    HuggingFaceDatasetError, column_of, column_problems,
)
from simpletuner.helpers.data_backend.storage import Listing
from simpletuner.helpers.metadata.backends.discovery import VANISHED, Probe, probe_head
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.backends.table_columns import pixels
from simpletuner.helpers.metadata.file_table import FileTable

if TYPE_CHECKING:
    from simpletuner.helpers.metadata.index_cache import LoadedIndex


class HuggingFaceSource:
    """``metadata_backend: huggingface`` (the only one of ``type: huggingface``)."""

    def __init__(self, storage: HuggingFaceStorage, dataset):
        self.storage = storage
        self.config = dataset.huggingface_config()
        self.wants_captions = dataset.caption_strategy == "huggingface"

    def key(self) -> dict:
        """What a cached reading depends on besides the rows: the columns read."""
        c = self.config
        return {"metadata_backend": "huggingface",
                "columns": [c.image_column, c.width_column, c.height_column,
                            c.caption_column if self.wants_captions else None,
                            c.fallback_caption_column if self.wants_captions else None]}

    def unchanged(self, listing: Listing, cached: "LoadedIndex") -> bool:
        """The same rows with the same bytes as when the cached index was built."""
        return not listing.unreadable and cached.same_files(listing)

    def read(self, listing: Listing, known: FileTable, show_progress: bool,
             store=None) -> FoundFiles:
        # store: unused; base adds the columns of what this returns (FoundFiles.stored)
        rows = self.storage.rows
        problems = column_problems(rows, self.config, self.wants_captions)
        if problems:
            raise HuggingFaceDatasetError("; ".join(problems))
        row_numbers = np.array([self.storage.row_of(i) for i in listing.sample_ids], np.int64)
        tabled = 0
        if self.config.width_column is not None:
            files, read, forgotten = self._sized_by_columns(listing, row_numbers), 0, 0
            tabled = len(files.ids)
        else:
            files, stale, forgotten = known.reconcile(listing)
            self._probe(files, stale, show_progress)
            read = len(stale)
        captions = None
        if self.wants_captions:
            captions = self._captions(row_numbers)
            for position in np.flatnonzero([c is None for c in captions]).tolist():
                self._refuse(files, position, row_numbers, "no caption in "
                             f"{self._caption_names()} (caption_strategy 'huggingface')")
        return FoundFiles(files, read, forgotten, [], captions, tabled=tabled)

    def _sized_by_columns(self, listing: Listing, row_numbers: np.ndarray) -> FileTable:
        c, rows = self.config, self.storage.rows
        widths = pixels(column_of(rows, c.width_column))[row_numbers]
        heights = pixels(column_of(rows, c.height_column))[row_numbers]
        files = FileTable(list(listing.sample_ids), list(listing.sizes),
                          list(listing.change_keys), widths.tolist(), heights.tolist())
        for position in np.flatnonzero((widths <= 0) | (heights <= 0)).tolist():
            self._refuse(files, position, row_numbers,
                         f"{c.width_column!r} x {c.height_column!r} is not a positive whole "
                         "number of pixels")
        return files

    def _probe(self, files: FileTable, stale: list[int], show_progress: bool) -> None:
        """Each stale row's size from its image header; a row that cannot be read (other than
        gone) raises: it says nothing about the image."""
        bar = tqdm(stale, desc=f"{self.storage.location}: reading image headers", unit="img",
                   disable=not show_progress or not stale)
        for position in bar:
            try:
                data = self.storage.read_bytes(files.ids[position])
            except FileNotFoundError:
                files.record(position, Probe(error=VANISHED))
                continue
            files.record(position, probe_head(data, len(data), Image.MAX_IMAGE_PIXELS))

    def _refuse(self, files: FileTable, position: int, row_numbers, reason: str) -> None:
        files.widths[position] = files.heights[position] = 0
        files.errors[files.ids[position]] = (f"{self.storage.location} row "
                                             f"{int(row_numbers[position])}: {reason}")

    def _caption_names(self) -> str:
        c = self.config
        names = [c.caption_column] if isinstance(c.caption_column, str) else c.caption_column
        return " or ".join(map(repr, [*names, *([c.fallback_caption_column]
                                                if c.fallback_caption_column else [])]))

    def _captions(self, row_numbers: np.ndarray) -> list[str | None]:
        """Each listed row's captions, one per line; None where it has none."""
        c, rows = self.config, self.storage.rows
        names = [c.caption_column] if isinstance(c.caption_column, str) else c.caption_column
        main = [column_of(rows, name).to_pylist() for name in names]
        fallback = (column_of(rows, c.fallback_caption_column).to_pylist()
                    if c.fallback_caption_column else None)
        captions: list[str | None] = []
        for row in row_numbers.tolist():
            texts = [t for column in main for t in _texts(column[row])]
            if not texts and fallback is not None:
                texts = _texts(fallback[row])
            captions.append("\n".join(texts) if texts else None)
        return captions


def _texts(value) -> list[str]:
    """The non-empty texts of one cell: a string, or a list of strings (others: none)."""
    values = value if isinstance(value, list) else [value]
    return [v.strip() for v in values if isinstance(v, str) and v.strip()]
