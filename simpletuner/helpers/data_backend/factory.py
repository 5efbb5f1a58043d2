"""The storage a dataset's ``type`` names: 'local' (a folder), 'aws' (S3-compatible) or
'huggingface' (a split's rows); listed by its metadata table instead of by itself with
``parquet.trust_table``."""

from __future__ import annotations

from simpletuner.helpers.data_backend.huggingface import HuggingFaceStorage
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.data_backend.storage import Storage


def open_storage(dataset) -> Storage:
    """For a configuration.DatasetConfig; the loader has checked the keys and the extras."""
    extensions = kind_of(dataset).extensions
    if dataset.type == "aws":
        from simpletuner.helpers.data_backend.s3 import S3Settings, S3Storage  # the 's3' extra

        storage = S3Storage(S3Settings.for_dataset(dataset), extensions)
    elif dataset.type == "huggingface":  # the datasets library is imported when it is opened
        return HuggingFaceStorage(dataset)
    else:
        storage = LocalStorage(dataset.instance_data_dir, extensions)
    if dataset.metadata_backend == "parquet" and dataset.parquet_config().trust_table:
        from simpletuner.helpers.metadata.backends.table_listed import TableListedStorage

        return TableListedStorage(storage, dataset)
    return storage
