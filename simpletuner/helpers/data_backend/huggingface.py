"""``type: huggingface``: the rows of one split of a datasets-library dataset, as a storage.

Each row is one sample, named ``<split>/<row index>``: stable for as long as the dataset is
unchanged, and the same on every rank, so the split, sampler, trace and audit treat the rows as
they treat files. A row's bytes are its image cell: the encoded image the Arrow file holds, or
the file it points to (an imagefolder's rows keep paths). The dataset is read-only and opened
on first use (huggingface_loading.py), on whichever rank asks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from simpletuner.helpers.data_backend.huggingface_loading import (
    HuggingFaceDatasetError, column_of, column_problems, files_digest, open_split,
)
from simpletuner.helpers.data_backend.storage import FileVersion, Listing


@dataclass
class _Rows:
    """Per row: the image's byte length (-1 where the cell holds a path) and that path."""

    lengths: list[int]
    paths: list[str | None]
    digest: str  # the change key of every row whose bytes are in the Arrow files


class HuggingFaceStorage:
    remote = False
    max_connections = 1

    def __init__(self, dataset):
        """For a configuration.DatasetConfig of type 'huggingface'."""
        self.config = dataset.huggingface_config()
        self.prefix = f"{self.config.split}/"
        self.location = f"{self.config.dataset_name} [{self.config.split}]"

    @cached_property
    def rows(self):
        """The split as an Arrow-formatted ``datasets.Dataset`` (cells are never decoded)."""
        return open_split(self.config).with_format("arrow")

    @cached_property
    def _images(self):
        """The image column; a missing one (or size column) is named before any row is read."""
        problems = column_problems(self.rows, self.config, wants_captions=False)
        if problems:
            raise HuggingFaceDatasetError("; ".join(problems))
        return column_of(self.rows, self.config.image_column)

    @cached_property
    def _scanned(self) -> _Rows:
        import pyarrow
        import pyarrow.compute as pc

        images = self._images
        if pyarrow.types.is_struct(images.type):  # an Image feature: {bytes, path}
            data, paths = pc.struct_field(images, "bytes"), pc.struct_field(images, "path")
        else:
            data, paths = images, pyarrow.nulls(len(images), pyarrow.string())
        lengths = pc.fill_null(pc.binary_length(data), -1).to_numpy().tolist()
        path_list = paths.to_pylist() if -1 in lengths else [None] * len(lengths)
        return _Rows(lengths, path_list, files_digest(self.rows))

    def row_of(self, sample_id: str) -> int | None:
        """The row a sample id names, or None."""
        number = sample_id[len(self.prefix):] if sample_id.startswith(self.prefix) else ""
        if not number.isdigit() or str(int(number)) != number:
            return None
        row = int(number)
        return row if row < len(self._scanned.lengths) else None

    def _version(self, row: int) -> FileVersion:
        """Raises OSError when the row's image is a file that cannot be found or read."""
        scanned = self._scanned
        if scanned.lengths[row] >= 0:
            return FileVersion(scanned.lengths[row], scanned.digest)
        stat = os.stat(self._path(row))
        return FileVersion(stat.st_size, stat.st_mtime_ns)

    def _path(self, row: int) -> str:
        path = self._scanned.paths[row]
        if path is None:
            raise FileNotFoundError(f"row {row} of {self.location} holds no image")
        return path

    def list_files(self) -> Listing:
        ids = sorted(f"{self.prefix}{row}" for row in range(len(self._scanned.lengths)))
        sample_ids, sizes, keys, unreadable = [], [], [], []
        for sample_id in ids:
            try:
                version = self._version(self.row_of(sample_id))
            except OSError as exc:
                unreadable.append((sample_id, f"image cannot be read ({exc.strerror or exc})"))
                continue
            sample_ids.append(sample_id)
            sizes.append(version.size)
            keys.append(version.change_key)
        return Listing(sample_ids, sizes, keys, {}, unreadable)

    def versions(self, names: list[str]) -> dict[str, FileVersion]:
        found = {}
        for name in names:
            row = self.row_of(name)
            try:
                if row is not None:
                    found[name] = self._version(row)
            except OSError:  # missing or unreadable: the caller reports it as a failure
                continue
        return found

    def read_bytes(self, name: str) -> bytes:
        row = self.row_of(name)
        if row is None:
            raise FileNotFoundError(f"no row {name!r} in {self.location}")
        if self._scanned.lengths[row] < 0:
            return Path(self._path(row)).read_bytes()
        import pyarrow

        cell = self._images[row]
        return (cell["bytes"] if pyarrow.types.is_struct(cell.type) else cell).as_py()

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self.read_bytes(name)[start:start + length]

    def write_atomic(self, name: str, data: bytes) -> None:
        raise PermissionError(f"{self.location} is a Hugging Face dataset, read-only here")

    def exists(self, name: str) -> bool:
        return self.row_of(name) is not None

    def local_path(self, name: str) -> None:
        return None  # a row's bytes are an Arrow cell, not a file

    def identity(self, name: str) -> str:
        return f"huggingface:{self.location}/{name}"
