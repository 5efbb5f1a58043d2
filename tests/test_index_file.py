"""The mapped index every rank loads (index_cache.py, index_file.py): the same index as the
main rank built, ids decoded exactly (names that are not UTF-8 too), the same split, and a
truncated, damaged or missing file refused, then rebuilt by the main rank."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
import zlib
from pathlib import Path

import numpy as np

from discovery_fixtures import dataset_config, encode, image, training_config, write
from simpletuner.helpers.metadata.backends.base import MetadataBackend, MetadataCacheError
from simpletuner.helpers.metadata.backends.table_columns import ArrowTexts
from simpletuner.helpers.data_backend.storage import Listing
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.index_cache import (
    DIGEST_KEY, LoadedIndex, cache_columns, cache_meta, load_cache,
)
from simpletuner.helpers.metadata.index_file import (
    ColumnFileWriter, IndexFileError, read_columns, write_columns,
)
from simpletuner.helpers.metadata.index_history import data_digest
from simpletuner.helpers.metadata.index_columns import MappedIds, StringColumn, TextColumn

SIZES = [(96, 64), (64, 96), (64, 64), (64, 64), (128, 64), (96, 64), (64, 64)]
ODD_NAMES = ["", "a", "caf\udce9.png", "lone\ud800.png", "ünï/ß.webp", "z" * 300]


def plain(index: DatasetIndex) -> DatasetIndex:
    copy = DatasetIndex(index.dataset_id, {key: list(ids) for key, ids in index.buckets.items()},
                        dict(index.original_sizes), list(index.skipped), dict(index.clips))
    copy.set_digest(index.digest())
    return copy


class StringColumnTest(unittest.TestCase):
    def test_every_string_comes_back_as_it_was(self):
        column = StringColumn.encode(ODD_NAMES)
        self.assertEqual([column.at(row) for row in range(len(column))], ODD_NAMES)
        rows = np.array([5, 0, 3, 3, 2], np.int64)
        self.assertEqual(column.many(rows), [ODD_NAMES[r] for r in rows.tolist()])
        self.assertEqual(column.many(np.array([], np.int64)), [])
        ids = MappedIds(column, np.array([1, 3, 4], np.int64))
        self.assertEqual(list(ids), ["a", "lone\ud800.png", "ünï/ß.webp"])
        self.assertEqual(ids[-1], "ünï/ß.webp")
        self.assertEqual(ids[1:], ["lone\ud800.png", "ünï/ß.webp"])
        with self.assertRaises(IndexError):
            ids[3]

    def test_a_name_holding_a_nul_is_refused_and_a_caption_kept(self):
        many = [f"dir{i % 7}/file_{i:07d}.png" for i in range(250_000)]  # 6 MB: several scans
        for names in (["a\0b"], ["a", "b\0"], ["\0"], ["\0", ""], many + ["late\0.png"],
                      ["\0early.png"] + many):
            with self.subTest(names=names[:2], count=len(names)):
                with self.assertRaisesRegex(ValueError, "NUL"):
                    StringColumn.encode(names)
        column = StringColumn.encode(many)
        self.assertEqual(len(column), len(many))
        self.assertEqual(column.many(np.array([0, 199_999, 249_999])),
                         [many[0], many[199_999], many[249_999]])
        self.assertEqual(list(MappedIds(column)), many)
        self.assertEqual(len(StringColumn.encode(["", ""])), 2)
        captions = ["first", "a\0b\0", "", "ünï", "caf\udce9"]
        column = TextColumn.encode(captions)
        self.assertEqual([column.at(row) for row in range(len(column))], captions)


    def test_a_tables_captions_are_laid_out_alike_from_their_arrow_buffers(self):
        import pyarrow

        texts = ["a", None, "", "ünï\0x", "caf\u00e9 last", None]
        whole = pyarrow.array(texts, pyarrow.string())
        for array in (whole, whole.slice(1), whole.slice(2, 3), pyarrow.array([], "string"),
                      pyarrow.array([None, None], pyarrow.string())):
            with self.subTest(array=array.to_pylist()):
                blob, starts = ArrowTexts(array).text_column()
                known = ArrowTexts(array).known()
                column = TextColumn(blob, starts)
                cells = array.to_pylist()
                self.assertEqual([column.at(row) for row in range(len(column))],
                                 [text or "" for text in cells])
                self.assertEqual(known.tolist(), [text is not None for text in cells])
                self.assertEqual(bytes(blob), "".join(text or "" for text in cells).encode())


class MappedIndexTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.data, self.output = Path(tmp.name) / "data", Path(tmp.name) / "out"
        for i, (w, h) in enumerate(SIZES):
            write(self.data, f"dir{i % 2}/img{i:02d}.png", encode(image(w, h, seed=i), "PNG"))
        write(self.data, "broken.png", b"not an image")
        # A plain copy: what refresh_index returns maps the file, which these tests damage.
        self.built = plain(self.backend().refresh_index(show_progress=False))

    def backend(self) -> MetadataBackend:
        return MetadataBackend.from_config(dataset_config(self.data),
                                           training_config(self.output))

    def test_a_rank_loads_what_the_main_rank_built(self):
        loaded = self.backend().load_index()
        self.assertEqual(loaded, self.built)
        self.assertEqual(loaded.known_digest, self.built.digest())
        for key, bucket in loaded.buckets.items():
            self.assertIsInstance(bucket, MappedIds)
            self.assertEqual(list(bucket), sorted(self.built.buckets[key]))
        self.assertEqual(loaded.original_sizes["dir0/img04.png"], (128, 64))
        self.assertNotIn("broken.png", loaded.original_sizes)
        self.assertEqual(len(loaded.original_sizes), len(SIZES))
        self.assertEqual([s.path for s in loaded.skipped], ["broken.png"])
        self.assertIn("dir0/img02.png", loaded.buckets["64x64"])
        self.assertNotIn("dir0/img03.png", loaded.buckets["64x64"])  # the other folder's

    def test_the_split_of_the_loaded_index_is_the_built_one(self):
        main, other = self.backend(), self.backend()
        loaded = other.load_index()
        for epoch in range(3):
            for rank in range(2):
                args = dict(seed=7, epoch=epoch, processes=2, rank=rank, accumulation=1)
                want = main.split_buckets_between_processes(self.built, **args)
                got = other.split_buckets_between_processes(loaded, **args)
                self.assertEqual({k: (s.samples, s.carried) for k, s in got.items()},
                                 {k: (s.samples, s.carried) for k, s in want.items()})

    def test_without_removes_only_those_samples(self):
        loaded = self.backend().load_index()
        smaller = loaded.without({"dir0/img02.png": "undecodable"})
        self.assertEqual(smaller, self.built.without({"dir0/img02.png": "undecodable"}))
        self.assertEqual(list(smaller.buckets["64x64"]), ["dir0/img06.png", "dir1/img03.png"])
        self.assertNotIn("dir0/img02.png", smaller.original_sizes)

    def assert_refused_then_rewritten(self, damage: str):
        with self.assertRaisesRegex(MetadataCacheError, damage):
            self.backend().load_index()
        main = self.backend()
        self.assertEqual(main.refresh_index(show_progress=False), self.built)
        self.assertEqual(main.last_refresh.read, len(SIZES) + 1)  # the one record: read again
        self.assertTrue(main.last_refresh.cache_written)
        self.assertEqual(self.backend().load_index(), self.built)

    def test_a_truncated_file_is_refused_and_rewritten(self):
        path = self.backend().cache_path
        path.write_bytes(path.read_bytes()[:-100])
        self.assert_refused_then_rewritten("truncated")

    def test_a_damaged_byte_is_refused_and_rewritten(self):
        path = self.backend().cache_path
        header_length = int.from_bytes(path.read_bytes()[-20:-12], "little")
        for at, damage in ((100, "CRC-32"),  # a column's byte
                           (-20 - header_length // 2, "damaged"),  # the header's
                           (-10, "truncated or extended")):  # the size in the footer
            with self.subTest(damage):
                data = bytearray(path.read_bytes())
                data[at] ^= 0x40
                path.write_bytes(bytes(data))
                self.assert_refused_then_rewritten(damage)

    def test_a_missing_cache_is_written_once_then_kept(self):
        path = self.backend().cache_path
        path.unlink()
        self.assert_refused_then_rewritten("no usable metadata cache")
        written = path.stat().st_mtime_ns
        self.backend().refresh_index(show_progress=False)
        self.assertEqual(path.stat().st_mtime_ns, written)  # whole and current: kept


class SameFilesTest(unittest.TestCase):
    """A table source's warm start takes the cache only for the very files it was built from."""

    def cache_for(self, folder: Path, change_keys: list) -> LoadedIndex:
        ids = ["a.png", "b/c.png", "caf\udce9.png"]
        files = FileTable(ids, [10, 20, 30], change_keys, [64] * 3, [64] * 3)
        rows = {"64x64": [0, 1, 2]}
        columns = cache_columns(files, StringColumn.encode(ids), rows, None)
        meta = cache_meta("d", {}, {}, files, rows, [],
                          {DIGEST_KEY: data_digest(columns, files, rows, []), "index_digest": ""})
        write_columns(folder / "d.index", meta, columns)
        return load_cache(folder / "d.index")

    def test_any_difference_in_ids_sizes_or_change_keys_is_seen(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        for keys, other_key in (([1, 2, 3], 4), (['"e1"', '"e2"', "e3"], "e4"),
                                (["1", "2", "3"], "4")):  # ETags of digits stay text
            cached = self.cache_for(Path(tmp.name), keys)
            ids, sizes = list(cached.ids), [10, 20, 30]
            with self.subTest(keys=keys):
                self.assertTrue(cached.same_files(Listing(ids, sizes, keys, {})))
                self.assertEqual(cached.file_table().change_keys, keys)
                for changed in (Listing(ids[:2], sizes[:2], keys[:2], {}),
                                Listing(["a.png", "b/d.png", ids[2]], sizes, keys, {}),
                                Listing(ids, [10, 21, 30], keys, {}),
                                Listing(ids, sizes, keys[:2] + [other_key], {}),
                                Listing(ids, sizes, [str(k) if isinstance(k, int) else int(
                                    k.strip('"')[-1]) for k in keys], {})):
                    self.assertFalse(cached.same_files(changed), changed)


class ColumnFileTest(unittest.TestCase):
    """The file layout itself: columns written while the caller works, the header last."""

    def setUp(self):
        self.folder = Path(tempfile.mkdtemp())

    def tearDown(self):
        shutil.rmtree(self.folder, ignore_errors=True)

    def test_columns_added_in_steps_come_back_with_the_header(self):
        path = self.folder / "c.index"
        with ColumnFileWriter(path) as writer:
            writer.add({"a": np.arange(5, dtype=np.int64)})
            writer.add({"b": np.array([True, False]), "c": np.frombuffer(b"xyz", np.uint8)})
            self.assertFalse(path.exists())  # in place only when committed
            writer.commit({"note": "ü"})
        meta, columns = read_columns(path)
        self.assertEqual(meta, {"note": "ü"})
        self.assertEqual({name: values.tolist() for name, values in columns.items()},
                         {"a": [0, 1, 2, 3, 4], "b": [True, False], "c": [120, 121, 122]})
        self.assertEqual(path.read_bytes()[:8], b"STIDX02\n")
        self.assertEqual(int.from_bytes(path.read_bytes()[-12:-4], "little"),
                         path.stat().st_size)

    def test_a_writer_left_without_a_commit_leaves_the_old_file_and_no_other(self):
        path = self.folder / "c.index"
        write_columns(path, {"version": "old"}, {"a": np.zeros(3, np.int64)})
        with self.assertRaises(KeyError):
            with ColumnFileWriter(path) as writer:
                writer.add({"a": np.ones(1 << 20, np.int64)})
                raise KeyError("the index could not be built")
        self.assertEqual(read_columns(path)[0], {"version": "old"})
        self.assertEqual([p.name for p in self.folder.iterdir()], ["c.index"])

    def test_a_file_of_the_earlier_layout_is_read(self):
        """Header first, its size in it: kept versions written before the footer still name
        a resume's changed files."""
        header = json.dumps({"meta": {"dataset_id": "d"}, "columns": {"x": ["|u1", 128, 3]},
                             "size": 135}).encode()
        head = b"STIDX01\n" + len(header).to_bytes(8, "little") + header
        data = head + bytes(128 - len(head)) + b"abc"
        path = self.folder / "old.index"
        path.write_bytes(data + zlib.crc32(data).to_bytes(4, "little"))
        meta, columns = read_columns(path)
        self.assertEqual((meta, columns["x"].tobytes()), ({"dataset_id": "d"}, b"abc"))
        path.write_bytes(data + bytes(4))
        with self.assertRaisesRegex(IndexFileError, "CRC-32"):
            read_columns(path)


if __name__ == "__main__":
    unittest.main()
