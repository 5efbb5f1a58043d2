"""``parquet.trust_table``: the metadata table is the file list; the storage is never listed.

For object stores where listing millions of keys (or a prefix shared with other data) is the
slow part. Every file the table names is taken to exist and to be unchanged: a missing one
fails when its latent is cached and is dropped on every rank alike (as a truncated file is),
and a changed one is not re-encoded while its cached latent exists. Rows are confined to the
dataset's folder or prefix as a listing is: one whose name holds '..' is skipped, saying so.
"""

from __future__ import annotations

import logging

from simpletuner.helpers.data_backend.storage import FileVersion, Listing, Storage, leaves_root
from simpletuner.helpers.metadata.backends.table_columns import read_file_names

logger = logging.getLogger(__name__)

TRUSTED = "table"  # the change key of every file: the table says nothing about its bytes


class TableListedStorage:
    """A storage whose listing and file versions come from the dataset's metadata table;
    reads and writes go to the storage itself."""

    def __init__(self, storage: Storage, dataset):
        self.storage = storage
        self.dataset_id = dataset.id
        self.config = dataset.parquet_config()
        self.location = storage.location
        self.remote = storage.remote
        self.max_connections = storage.max_connections

    def list_files(self) -> Listing:
        names = [name for name in read_file_names(self.config.path, self.config.filename_column)
                 if not leaves_root(name)]  # their rows are skipped as unlisted, saying why
        if names:  # one request: a wrong bucket, credentials or endpoint is named now
            try:
                self.storage.read_range(names[0], 0, 1)
            except FileNotFoundError:
                pass  # that one file is missing: dropped when its latent is cached
        logger.info("dataset '%s': the file list is the metadata table %s (parquet.trust_table); "
                    "%s is not listed, so a missing image is dropped when its latent is cached",
                    self.dataset_id, self.config.path, self.location)
        return Listing(names, [0] * len(names), [TRUSTED] * len(names), {})

    def versions(self, names: list[str]) -> dict[str, FileVersion]:
        return dict.fromkeys(names, FileVersion(0, TRUSTED))

    def read_range(self, name: str, start: int, length: int) -> bytes:
        return self.storage.read_range(name, start, length)

    def read_bytes(self, name: str) -> bytes:
        return self.storage.read_bytes(name)

    def write_atomic(self, name: str, data: bytes) -> None:
        self.storage.write_atomic(name, data)

    def exists(self, name: str) -> bool:
        return self.storage.exists(name)

    def local_path(self, name: str):
        return self.storage.local_path(name)

    def identity(self, name: str) -> str:
        return self.storage.identity(name)
