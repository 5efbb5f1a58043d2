"""A metadata table's rows are confined to the dataset's folder like a listing: a row naming
`../outside.png` (a real file beside the folder) is skipped and reported, never trained, with
`parquet.trust_table` (the table is the file list) as without it. Real parquet, real files."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import pyarrow
import pyarrow.parquet

from discovery_fixtures import encode, image, training_config, write
from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.metadata.backends.base import MetadataBackend

ESCAPING = ["../outside.png", "sub/../../outside.png"]


class TableConfinementTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "data"
        png = encode(image(64, 64), "PNG")
        write(self.data, "inside.png", png)
        write(self.data, "sub/also.png", png)
        write(self.root, "outside.png", png)  # real, readable, and not the dataset's
        rows = [{"filename": name, "width": 64, "height": 64, "caption": "a square"}
                for name in ["inside.png", "sub/also.png", *ESCAPING]]
        self.table = self.root / "meta.parquet"
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), self.table)

    def index(self, trust_table: bool):
        dataset = DatasetConfig(id="photos", instance_data_dir=str(self.data),
                                metadata_backend="parquet", caption_strategy="parquet",
                                parquet={"path": str(self.table), "caption_column": "caption",
                                         "trust_table": trust_table})
        output = self.root / f"out-{trust_table}"
        return MetadataBackend.from_config(dataset, training_config(output)).refresh_index(False)

    def test_an_escaping_row_is_skipped_and_reported(self):
        for trust_table in (True, False):
            with self.subTest(trust_table=trust_table):
                index = self.index(trust_table)
                self.assertEqual(index.buckets, {"64x64": ["inside.png", "sub/also.png"]})
                reasons = {s.path: s.reason for s in index.skipped}
                self.assertEqual(sorted(reasons), sorted(ESCAPING))
                for name in ESCAPING:
                    self.assertIn("reaches outside", reasons[name])


if __name__ == "__main__":
    unittest.main()
