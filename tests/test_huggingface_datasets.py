"""type: huggingface with the real datasets library: the config's keys (SimpleTuner's, the
huggingface block's refusals), ``python -m simpletuner check`` on good and broken configs, and
discovery: every row indexed once as '<split>/<row>', sizes from width/height columns without
opening an image or from the image bytes, captions from caption_column."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from huggingface_fixtures import hub_snapshot, imagefolder, save_rows, shape_rows
from launching import REPO, run_bounded
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.data_backend.huggingface_loading import HuggingFaceDatasetError
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.multiaspect.captions import CaptionPolicy


class Folder(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="st-hf-"))
        self.addCleanup(shutil.rmtree, self.root, True)

    def write(self, *datasets: dict) -> Path:
        """config.json and multidatabackend.json in the folder; the config's path."""
        (self.root / "multidatabackend.json").write_text(json.dumps(list(datasets)))
        config = self.root / "config.json"
        config.write_text(json.dumps({
            "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
            "output_dir": str(self.root / "out"), "resolution": 64,
            "aspect_bucket_alignment": 16, "validation_resolution": 64, "max_train_steps": 2,
            "data_backend_config": str(self.root / "multidatabackend.json")}))
        return config

    def problems(self, *datasets: dict) -> str:
        with self.assertRaises(ConfigError) as caught:
            load_configuration(self.write(*datasets), cwd=self.root)
        return str(caught.exception)


class HuggingFaceConfigTest(Folder):
    def test_simpletuners_entry_loads_with_its_defaults(self):
        save_rows(self.root / "anime", {"train": shape_rows([(64, 64)])})
        config = load_configuration(self.write({  # SimpleTuner's anima example, as it writes it
            "id": "anime", "type": "huggingface", "dataset_name": "anime",
            "image_column": "image", "caption_column": "text",
            "huggingface": {"dataset_name": "anime", "image_column": "image",
                            "caption_column": "text", "file_extension": "jpg"}}), cwd=self.root)
        dataset = config.datasets[0]
        self.assertEqual((dataset.caption_strategy, dataset.metadata_backend),
                         ("huggingface", "huggingface"))
        hf = dataset.huggingface_config()
        self.assertEqual((hf.dataset_name, hf.split, hf.caption_column),
                         (str(self.root / "anime"), "train", "text"))

    def test_block_keys_that_ask_for_more_are_refused_by_name(self):
        save_rows(self.root / "d", {"train": shape_rows([(64, 64)])})
        text = self.problems(
            {"id": "a", "type": "huggingface", "dataset_name": "d",
             "huggingface": {"filter_func": {"min_width": 512}, "video_column": "v",
                             "streaming": True, "composite_image_config": {"enabled": True}}},
            {"id": "b", "type": "huggingface", "dataset_name": "d", "split": "train",
             "huggingface": {"split": "test", "width_column": "w"}},
            {"id": "c", "type": "huggingface", "dataset_name": "d",
             "caption_strategy": "textfile"},
            {"id": "e", "instance_data_dir": "d", "caption_column": "text"})
        for expected in ("(id 'a'): key 'huggingface': SimpleTuner option 'filter_func' is not "
                         "supported here (accepted as null or false); remove it; filter the "
                         "dataset first",
                         "(id 'a'): key 'huggingface': SimpleTuner option 'video_column'",
                         "(id 'a'): key 'huggingface': streaming is not supported",
                         "(id 'a'): key 'huggingface': composite_image_config is not supported",
                         "(id 'b'): key 'split' is 'train' but huggingface.split is 'test'",
                         "(id 'b'): key 'huggingface': width_column and height_column",
                         "(id 'c'): type 'huggingface' takes caption_strategy 'huggingface'",
                         "(id 'e'): key 'caption_column' is for type 'huggingface' only"):
            self.assertIn(expected, text)
        self.assertEqual(len(text.splitlines()), 9, text)  # the 8 and the report's heading

    def test_a_block_that_asks_for_nothing_is_accepted(self):
        save_rows(self.root / "d", {"train": shape_rows([(64, 64)])})
        config = load_configuration(self.write(
            {"id": "a", "type": "huggingface", "dataset_name": "d", "caption_strategy":
             "instanceprompt", "instance_prompt": "a shape",
             "huggingface": {"streaming": False, "composite_image_config": {"enabled": False},
                             "auto_load": True}}), cwd=self.root)
        self.assertEqual(config.datasets[0].caption_strategy, "instanceprompt")

    def test_a_missing_datasets_library_is_named_once_with_the_extra(self):
        save_rows(self.root / "d", {"train": shape_rows([(64, 64)])})
        # None in sys.modules is how Python marks a module that cannot be imported.
        with mock.patch.dict(sys.modules, {"datasets": None}):
            text = self.problems({"id": "a", "type": "huggingface", "dataset_name": "d"})
        self.assertEqual(text.count("'huggingface' needs datasets, which is not installed; run "
                                    "pip install 'simpletuner[huggingface]'"), 1, text)


class CheckCommandTest(Folder):
    """``python -m simpletuner check``, as ./train.sh runs it before launching."""

    def check(self, config: Path) -> tuple[int, str, str]:
        """(exit status, stdout, stderr)"""
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(self.root / "hf-home")}
        tmp = self.root / "tmp"
        tmp.mkdir(exist_ok=True)
        result = run_bounded([sys.executable, "-m", "simpletuner", "check", "--config",
                              str(config)], tmpdir=tmp, env=env, timeout=120, cwd=self.root)
        return result.returncode, result.stdout, result.stderr

    def test_a_saved_folder_and_a_downloaded_hub_id_pass(self):
        rows = shape_rows([(64, 64), (96, 64)])
        save_rows(self.root / "saved", {"train": rows})
        hub_snapshot(self.root / "hf-home", "someone/shapes", rows, self.root)
        status, printed, output = self.check(self.write(
            {"id": "saved", "type": "huggingface", "dataset_name": "saved",
             "caption_column": "text"},
            {"id": "hub", "type": "huggingface", "dataset_name": "someone/shapes",
             "huggingface": {"caption_column": "text", "width_column": "w",
                             "height_column": "h"}}))
        self.assertEqual((status, printed.strip()), (0, "1"), output)  # 1 process to launch

    def test_a_missing_folder_is_named_with_its_file_and_key(self):
        status, _, output = self.check(self.write(
            {"id": "gone", "type": "huggingface", "dataset_name": str(self.root / "nowhere")}))
        self.assertEqual(status, 2, output)
        self.assertIn(f"{self.root / 'multidatabackend.json'}: dataset [0] (id 'gone'): key "
                      f"'dataset_name': folder {self.root / 'nowhere'} does not exist", output)

    def test_a_missing_column_split_or_download_is_named_with_its_key(self):
        save_rows(self.root / "saved", {"train": shape_rows([(64, 64)])})
        status, _, output = self.check(self.write(
            {"id": "columns", "type": "huggingface", "dataset_name": "saved",
             "caption_column": "prompt"},
            {"id": "splits", "type": "huggingface", "dataset_name": "saved",
             "split": "test", "caption_column": "text"},
            {"id": "hub", "type": "huggingface", "dataset_name": "someone/elsewhere"}))
        self.assertEqual(status, 2, output)
        where = f"{self.root / 'multidatabackend.json'}: dataset (id "
        self.assertIn(f"{where}'columns'): key 'huggingface.caption_column': no column 'prompt' "
                      f"in {self.root / 'saved'} [train] (it has image, text, w, h)", output)
        self.assertIn(f"{where}'splits'): key 'split': {self.root / 'saved'} holds the split "
                      "'train'", output)
        self.assertIn(f"{where}'hub'): key 'dataset_name': 'someone/elsewhere' is no folder and "
                      "is not downloaded", output)
        self.assertIn("hf download --repo-type dataset someone/elsewhere", output)


class HuggingFaceDiscoveryTest(Folder):
    def index(self, **keys):
        config = load_configuration(self.write({
            "id": "hf", "type": "huggingface", "minimum_image_size": 0, **keys}), cwd=self.root)
        backend = MetadataBackend.from_config(config.datasets[0], config.training)
        return backend, backend.refresh_index(show_progress=False)

    @staticmethod
    def indexed(index) -> list[str]:
        return sorted(s for ids in index.buckets.values() for s in ids)

    def test_sizes_come_from_the_columns_and_no_image_is_opened(self):
        rows = shape_rows([(64, 64)] * 4)
        for row, (w, h) in zip(rows, [(96, 64), (64, 96), (64, 64), (0, 64)]):
            row["w"], row["h"] = w, h  # the columns say otherwise than the images
        rows[2]["image"] = {"bytes": b"no image at all", "path": None}
        save_rows(self.root / "d", {"train": rows})
        backend, index = self.index(dataset_name="d", caption_column="text",
                                    huggingface={"width_column": "w", "height_column": "h"})
        self.assertEqual(self.indexed(index), ["train/0", "train/1", "train/2"])
        self.assertEqual({s: index.original_sizes[s] for s in self.indexed(index)},
                         {"train/0": (96, 64), "train/1": (64, 96), "train/2": (64, 64)})
        self.assertEqual([(s.path, s.reason) for s in index.skipped], [(
            "train/3", f"{self.root / 'd'} [train] row 3: 'w' x 'h' is not a positive whole "
                       "number of pixels")])
        self.assertEqual(backend.caption_for("train/1"), "shape number 1")

    def test_sizes_come_from_the_image_bytes_without_size_columns(self):
        sizes = [(64, 64), (96, 64), (64, 96)] * 4  # rows 10 and 11: ids sort after train/1
        rows = shape_rows(sizes)
        rows[4]["image"] = {"bytes": b"no image at all", "path": None}
        save_rows(self.root / "d", {"train": rows})
        backend, index = self.index(dataset_name="d", caption_column="text")
        expected = {f"train/{i}": size for i, size in enumerate(sizes) if i != 4}
        self.assertEqual(self.indexed(index), sorted(expected))
        self.assertEqual({s: index.original_sizes[s] for s in expected}, expected)
        self.assertEqual([(s.path, s.reason) for s in index.skipped],
                         [("train/4", "not an image")])
        self.assertEqual(backend.storage.read_bytes("train/10"), rows[10]["image"]["bytes"])
        self.assertEqual(backend.last_refresh.read, 12)
        again = MetadataBackend.from_config(backend.dataset, backend.training)
        self.assertEqual(again.refresh_index(show_progress=False).buckets, index.buckets)
        self.assertEqual((again.last_refresh.read, again.last_refresh.cache_written), (0, False))

    def test_an_imagefolder_is_read_from_its_files(self):
        sizes = [(64, 64), (96, 64), (64, 96)]
        imagefolder(self.root / "folder", sizes)
        backend, index = self.index(dataset_name="folder", caption_column="text",
                                    huggingface={"cache_dir": str(self.root / "hf-cache")})
        self.assertEqual({s: index.original_sizes[s] for s in self.indexed(index)},
                         {f"train/{i}": size for i, size in enumerate(sizes)})
        self.assertEqual(backend.storage.read_bytes("train/1"),
                         (self.root / "folder" / "train" / "1.png").read_bytes())
        self.assertEqual(backend.caption_for("train/2"), "file shape 2")

    def test_every_caption_of_a_row_is_one_of_its_captions(self):
        rows = shape_rows([(64, 64)] * 4)
        extra = [(["a circle", " "], "spare 0"), ([], "spare 1"), ([], None), (["x"], None)]
        for row, (tags, spare) in zip(rows, extra):
            row["tags"], row["spare"] = tags, spare
        rows[2]["text"] = rows[1]["text"] = "  "
        save_rows(self.root / "d", {"train": rows, "test": shape_rows([(64, 64)])})
        backend, index = self.index(dataset_name="d", huggingface={
            "caption_column": ["text", "tags"], "fallback_caption_column": "spare"})
        policy = CaptionPolicy()
        self.assertEqual(policy.candidates(backend.caption_for("train/0")),
                         ["shape number 0", "a circle"])
        self.assertEqual(policy.candidates(backend.caption_for("train/1")), ["spare 1"])
        self.assertEqual(policy.candidates(backend.caption_for("train/3")),
                         ["shape number 3", "x"])
        self.assertEqual([(s.path, s.reason) for s in index.skipped], [(
            "train/2", f"{self.root / 'd'} [train] row 2: no caption in 'text' or 'tags' or "
                       "'spare' (caption_strategy 'huggingface')")])

    def test_a_dotted_caption_column_names_a_field_of_a_struct_column(self):
        rows = shape_rows([(64, 64)] * 2)
        for i, row in enumerate(rows):
            row["meta"] = {"caption": f"nested caption {i}"}
        save_rows(self.root / "d", {"train": rows})
        backend, index = self.index(dataset_name="d", caption_column="meta.caption")
        self.assertEqual(self.indexed(index), ["train/0", "train/1"])
        self.assertEqual(backend.caption_for("train/1"), "nested caption 1")

    def test_another_split_has_its_own_ids_and_an_unknown_one_is_named(self):
        save_rows(self.root / "d", {"train": shape_rows([(64, 64)] * 3),
                                    "test": shape_rows([(96, 64)] * 2)})
        _, index = self.index(dataset_name="d", split="test", caption_column="text")
        self.assertEqual(self.indexed(index), ["test/0", "test/1"])
        with self.assertRaises(HuggingFaceDatasetError) as caught:
            self.index(dataset_name="d", split="validation", caption_column="text")
        self.assertIn("'validation' is not a split of", str(caught.exception))
        self.assertIn("(it has train, test)", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
