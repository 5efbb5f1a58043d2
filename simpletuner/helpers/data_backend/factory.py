"""The storage a dataset's ``type`` names: 'local' (a folder) or 'aws' (S3-compatible)."""

from __future__ import annotations

from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.data_backend.storage import Storage


def open_storage(dataset) -> Storage:
    """For a configuration.DatasetConfig; the loader has checked the keys and the extras."""
    if dataset.type == "aws":
        from simpletuner.helpers.data_backend.s3 import S3Settings, S3Storage  # the 's3' extra

        return S3Storage(S3Settings.for_dataset(dataset))
    return LocalStorage(dataset.instance_data_dir)
