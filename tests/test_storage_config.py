"""multidatabackend.json keys of the storage and metadata backends: SimpleTuner's aws_* keys,
metadata_backend and its parquet block, each mistake reported with the key, and credentials
kept out of the config's repr."""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from simpletuner.configuration import ConfigError, load_configuration

SECRET = "do-not-print-this-secret-123"


class StorageConfigTest(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp())
        (self.root / "images").mkdir()

    def load(self, *datasets: dict):
        (self.root / "multidatabackend.json").write_text(json.dumps(list(datasets)))
        (self.root / "config.json").write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": "out", "data_backend_config": "multidatabackend.json"}))
        return load_configuration(self.root / "config.json", cwd=self.root)

    def problems(self, *datasets: dict) -> str:
        with self.assertRaises(ConfigError) as caught:
            self.load(*datasets)
        return str(caught.exception)

    def test_an_aws_dataset_needs_no_folder_and_hides_its_credentials(self):
        config = self.load({"id": "bucket", "type": "aws", "aws_bucket_name": "photos",
                            "aws_data_prefix": "set one/", "aws_access_key_id": "AKIAID",
                            "aws_secret_access_key": SECRET, "aws_max_pool_connections": 16})
        dataset = config.datasets[0]
        self.assertEqual((dataset.aws_bucket_name, dataset.aws_max_pool_connections),
                         ("photos", 16))
        self.assertIsNone(dataset.instance_data_dir)
        self.assertNotIn(SECRET, repr(config))
        self.assertNotIn("AKIAID", repr(dataset))

    def test_storage_mistakes_are_named(self):
        text = self.problems(
            {"id": "a", "type": "aws"},
            {"id": "b"},
            {"id": "c", "instance_data_dir": "images", "metadata_backend": "parquet"},
            {"id": "d", "instance_data_dir": "images", "caption_strategy": "parquet"},
            {"id": "e", "instance_data_dir": "images", "metadata_backend": "parquet",
             "parquet": {"path": "meta.csv", "widht_column": "w"}},
            {"id": "f", "instance_data_dir": "images", "metadata_backend": "tabular"})
        self.assertIn("(id 'a'): key 'aws_bucket_name' is required for type 'aws'", text)
        self.assertIn("(id 'b'): missing required key 'instance_data_dir'", text)
        self.assertIn("(id 'c'): key 'parquet': metadata_backend 'parquet' needs a 'parquet' "
                      "object", text)
        self.assertIn("(id 'd'): caption_strategy 'parquet' takes captions from the metadata "
                      "table", text)
        self.assertIn("(id 'e'): key 'parquet': unknown key 'widht_column' (did you mean "
                      "'width_column'?)", text)
        self.assertIn("expected a .parquet or .jsonl file", text)
        self.assertIn("(id 'f'): key 'metadata_backend' is 'tabular'", text)

    def test_a_trusted_table_needs_what_a_listing_would_give(self):
        text = self.problems(
            {"id": "t", "instance_data_dir": "images", "metadata_backend": "parquet",
             "caption_strategy": "textfile", "parquet": {"path": "m.parquet", "trust_table": True}},
            {"id": "u", "instance_data_dir": "images", "metadata_backend": "parquet",
             "parquet": {"path": "m.parquet", "trust_table": True,
                         "identifier_includes_extension": False}})
        self.assertIn("(id 't'): parquet.trust_table does not list the storage, so caption "
                      "files cannot be found", text)
        self.assertIn("(id 'u'): parquet.trust_table needs file names with their extension",
                      text)
        config = self.load({"id": "v", "instance_data_dir": "images", "metadata_backend": "parquet",
                            "caption_strategy": "filename",
                            "parquet": {"path": "m.parquet", "trust_table": True}})
        self.assertTrue(config.datasets[0].parquet_config().trust_table)

    def test_discovery_is_the_explicit_default_and_table_paths_are_resolved(self):
        config = self.load(
            {"id": "a", "instance_data_dir": "images", "metadata_backend": "discovery"},
            {"id": "b", "instance_data_dir": "images", "metadata_backend": "parquet",
             "caption_strategy": "parquet",
             "parquet": {"path": "meta/table.parquet", "caption_column": "text"}})
        self.assertEqual(config.datasets[0].metadata_backend, "discovery")
        table = config.datasets[1].parquet_config()
        self.assertEqual(Path(table.path), self.root / "meta" / "table.parquet")
        self.assertEqual((table.filename_column, table.width_column, table.caption_column),
                         ("filename", "width", "text"))

    def test_a_backend_without_its_extra_names_the_install_command(self):
        # None in sys.modules is how Python marks a module that cannot be imported.
        with mock.patch.dict(sys.modules, {"boto3": None, "pyarrow": None}):
            text = self.problems(
                {"id": "a", "type": "aws", "aws_bucket_name": "photos"},
                {"id": "b", "instance_data_dir": "images", "metadata_backend": "parquet",
                 "parquet": {"path": "meta.parquet"}})
        self.assertIn("(id 'a'): 'aws' needs boto3, which is not installed; run pip install "
                      "'simpletuner[s3]'", text)
        self.assertIn("(id 'b'): 'parquet' needs pyarrow, which is not installed; run pip "
                      "install 'simpletuner[parquet]'", text)


if __name__ == "__main__":
    unittest.main()
