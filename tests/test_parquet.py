"""metadata_backend 'parquet' (.parquet and .jsonl tables, real pyarrow): the index equals the
one header discovery builds for the same images, every kind of bad row is reported with its
row and skipped, captions come from the table, and a million-row table is indexed without a
single image read."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import unittest
from itertools import product
from pathlib import Path

import numpy as np
import pyarrow
import pyarrow.parquet
import torch.nn.functional as F

from discovery_fixtures import encode, image, rotated_jpeg, training_config, write
from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.data_backend.storage import Listing
from simpletuner.helpers.metadata.backends.base import MetadataBackend, MetadataCacheError
from simpletuner.helpers.metadata.backends.table import TableFormatError, TableSource
from simpletuner.helpers.metadata.backends.table_columns import (
    arrow_strings, caption_text,
)
from simpletuner.plan_report import skip_summary
from simpletuner.helpers.metadata.backends.table_lookup import (
    NOT_LISTED, positions_in, positions_in_sorted,
)
from simpletuner.helpers.metadata.index_cache import VERSION, load_cache
from simpletuner.helpers.metadata.index_columns import StringColumn
from simpletuner.helpers.metadata.index_file import read_columns, write_columns

IMAGES = {"a.png": (64, 64, "PNG"), "sub/b c.jpg": (96, 64, "JPEG"),
          "sub/ünï.webp": (64, 96, "WEBP"), "d.png": (80, 48, "PNG")}


def write_table(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


class ListedOnly:
    """Storage that lists names and sizes but refuses every read: proves no image is opened."""

    remote = False
    max_connections = 1
    location = "memory://listed-only"

    def __init__(self, names: list[str]):
        self.names = sorted(names)

    def list_files(self) -> Listing:
        return Listing(self.names, [1000] * len(self.names), [1] * len(self.names), {})

    def read_range(self, name, start, length):
        raise AssertionError(f"an image was read: {name}")

    read_bytes = local_path = read_range


class TableIndexTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.data = self.tmp / "data"
        self.rows = []
        for i, (name, (w, h, fmt)) in enumerate(IMAGES.items()):
            write(self.data, name, encode(image(w, h, seed=i), fmt), caption=f"file caption {i}")
            self.rows.append({"filename": name, "width": w, "height": h, "caption": f"cap {i}"})
        write(self.data, "rot.jpg", rotated_jpeg(96, 64, 6), caption="rotated")
        self.rows.append({"filename": "rot.jpg", "width": 64, "height": 96, "caption": "cap r"})

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def backend(self, table: Path, output="out", **overrides) -> MetadataBackend:
        block = {"path": str(table), "caption_column": "caption",
                 **overrides.pop("parquet", {})}
        dataset = DatasetConfig(id="photos", instance_data_dir=str(self.data),
                                metadata_backend="parquet", parquet=block, **overrides)
        return MetadataBackend.from_config(dataset, training_config(self.tmp / output))

    def discovered(self):
        backend = MetadataBackend.from_config(
            DatasetConfig(id="photos", instance_data_dir=str(self.data)),
            training_config(self.tmp / "out-discovery"))
        return backend.refresh_index(show_progress=False)

    def test_parquet_and_jsonl_give_the_index_discovery_gives(self):
        expected = self.discovered()
        for suffix in (".parquet", ".jsonl"):
            with self.subTest(suffix=suffix):
                table = write_table(self.tmp / f"meta{suffix}", self.rows)
                index = self.backend(table, output=f"out{suffix}").refresh_index(False)
                self.assertEqual(index.buckets, expected.buckets)
                self.assertEqual(dict(index.original_sizes), dict(expected.original_sizes))
                self.assertEqual(index.skipped, expected.skipped)
                self.assertEqual(index.digest(), expected.digest())

    def test_a_first_build_says_its_sizes_came_from_the_table_not_the_cache(self):
        table = write_table(self.tmp / "meta.parquet", self.rows)
        backend = self.backend(table)
        backend.refresh_index(False)
        report = backend.last_refresh
        self.assertEqual((report.tabled, report.read, report.reused),
                         (len(self.rows), 0, 0))

    def test_captions_come_from_the_table_on_every_rank(self):
        rows = [dict(r) for r in self.rows]
        rows[1]["caption"] = None
        rows[1]["short"] = "fallback caption"
        for row in rows:
            row.setdefault("short", "unused")
        table = write_table(self.tmp / "meta.parquet", rows)
        main = self.backend(table, caption_strategy="parquet",
                            parquet={"fallback_caption_column": "short"})
        main.refresh_index(False)
        other = self.backend(table, caption_strategy="parquet",
                             parquet={"fallback_caption_column": "short"})
        other.load_index()
        expected = {row["filename"]: row["caption"] or row["short"] for row in rows}
        self.assertEqual({name: other.caption_for(name) for name in expected}, expected)
        self.assertEqual(expected["sub/b c.jpg"], "fallback caption")
        # rows out of the listing's order: the captions stay in the table's, each file's row
        # beside them
        columns = load_cache(main.cache_path).columns
        self.assertEqual([r["filename"] for r in rows], [*IMAGES, "rot.jpg"])
        self.assertEqual(columns["caption_rows"].tolist(), [0, 3, 4, 1, 2])  # sorted ids' rows

    def test_caption_rows_outside_the_captions_are_refused_by_load_index(self):
        table = write_table(self.tmp / "meta.parquet", self.rows)
        main = self.backend(table, caption_strategy="parquet")
        main.refresh_index(False)
        meta, columns = read_columns(main.cache_path)
        for bad_row, bad_length in ((5, 0), (-2, 0), (0, 1)):
            damaged = {name: np.array(values) for name, values in columns.items()}
            damaged["caption_rows"][1] = bad_row
            damaged["caption_rows"] = np.append(damaged["caption_rows"],
                                                np.zeros(bad_length, np.int64))
            write_columns(main.cache_path, meta, damaged)
            with self.subTest(row=bad_row, extra=bad_length):
                with self.assertRaisesRegex(MetadataCacheError, "malformed index.*caption"):
                    self.backend(table, caption_strategy="parquet").load_index()

    def test_a_table_in_the_listings_order_keeps_no_caption_rows_and_older_caches_hold(self):
        rows = sorted(self.rows, key=lambda row: row["filename"])
        table = write_table(self.tmp / "meta.parquet", rows)
        main = self.backend(table, caption_strategy="parquet")
        main.refresh_index(False)
        meta, columns = read_columns(main.cache_path)
        self.assertNotIn("caption_rows", columns)
        # a version 2 cache (before caption_rows existed) is taken as it is, not rebuilt
        write_columns(main.cache_path, {**meta, "version": 2},
                      {name: np.array(values) for name, values in columns.items()})
        again = self.backend(table, caption_strategy="parquet")
        again.refresh_index(False)
        self.assertFalse(again.last_refresh.cache_written)
        self.assertEqual({r["filename"]: again.caption_for(r["filename"]) for r in rows},
                         {r["filename"]: r["caption"] for r in rows})
        write_columns(main.cache_path, {**meta, "version": 1}, dict(columns))
        rebuilt = self.backend(table, caption_strategy="parquet")
        rebuilt.refresh_index(False)
        self.assertTrue(rebuilt.last_refresh.cache_written)
        self.assertEqual(load_cache(main.cache_path).meta["version"], VERSION)

    def test_identifiers_without_extension(self):
        rows = [{**r, "filename": r["filename"].rsplit(".", 1)[0]} for r in self.rows]
        table = write_table(self.tmp / "meta.jsonl", rows)
        index = self.backend(table, parquet={"identifier_includes_extension": False}
                             ).refresh_index(False)
        self.assertEqual(index.digest(), self.discovered().digest())

    def test_every_bad_row_is_reported_with_its_row_and_skipped(self):
        rows = self.rows[:2] + [
            {"filename": "", "width": 64, "height": 64, "caption": "x"},              # row 2
            {"filename": "d.png", "width": None, "height": 48, "caption": "x"},       # row 3
            {"filename": "rot.jpg", "width": 64, "height": -96, "caption": "x"},      # row 4
            {"filename": "sub/ünï.webp", "width": "64", "height": 96, "caption": ""},  # row 5
            {"filename": "gone.png", "width": 64, "height": 64, "caption": "x"},      # row 6
            {"filename": "a.png", "width": 64, "height": 64, "caption": "again"},     # row 7
            {"filename": ["a.png"], "width": 64, "height": 64, "caption": "x"},       # row 8
            {"filename": "gone2.png", "width": 64, "height": 64, "caption": "x"},     # row 9
        ]
        write(self.data, "norow.png", encode(image(64, 64), "PNG"))
        table = write_table(self.tmp / "meta.jsonl", rows)
        index = self.backend(table).refresh_index(False)
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertIn("'filename' is empty, missing or not text", reasons["<row 2>"])
        self.assertIn("'filename' is empty, missing or not text", reasons["<row 8>"])
        self.assertIn("row 3: 'width' x 'height' is None x 48", reasons["d.png"])
        self.assertIn("row 4: 'width' x 'height' is 64 x -96", reasons["rot.jpg"])
        self.assertIn("row 5: 'width' x 'height' is '64' x 96", reasons["sub/ünï.webp"])
        self.assertIn("no such image in", reasons["gone.png"])
        # Absent rows share one reason: plan counts them on one line, however many they are.
        self.assertEqual(reasons["gone2.png"], reasons["gone.png"])
        self.assertIn(f"       2  {reasons['gone.png']}", skip_summary(index).splitlines())
        self.assertIn("row 7: a second row for this file (first: row 0)", reasons["a.png"])
        self.assertIn("no row in the metadata table", reasons["norow.png"])
        self.assertEqual(sorted(s for ids in index.buckets.values() for s in ids),
                         ["a.png", "sub/b c.jpg"])
        captioned = self.backend(table, output="out-cap", caption_strategy="parquet")
        reasons = {s.path: s.reason for s in captioned.refresh_index(False).skipped}
        self.assertIn("row 5: 'width' x 'height'", reasons["sub/ünï.webp"])
        rows[5]["width"] = 64
        table = write_table(self.tmp / "meta2.jsonl", rows)
        captioned = self.backend(table, output="out-cap2", caption_strategy="parquet")
        reasons = {s.path: s.reason for s in captioned.refresh_index(False).skipped}
        self.assertIn("row 5: empty 'caption' (caption_strategy 'parquet')",
                      reasons["sub/ünï.webp"])

    def test_row_order_does_not_change_the_index(self):
        listed = sorted(self.rows, key=lambda r: r["filename"])  # the listing's own order
        expected = self.discovered().digest()
        for name, rows in (("listing order", listed), ("reversed", listed[::-1])):
            with self.subTest(name):
                table = write_table(self.tmp / f"{name}.parquet", rows)
                self.assertEqual(self.backend(table, output=name).refresh_index(False).digest(),
                                 expected)
        unnamed = [dict(r) for r in listed]
        unnamed[1]["filename"] = None  # in listing order but for one row: that row names nothing
        table = write_table(self.tmp / "unnamed.parquet", unnamed)
        reasons = {s.path: s.reason for s in
                   self.backend(table, output="unnamed").refresh_index(False).skipped}
        self.assertIn("'filename' is empty, missing or not text", reasons["<row 1>"])
        self.assertIn("no row in the metadata table", reasons[listed[1]["filename"]])

    def test_arrow_column_types(self):
        names = [r["filename"] for r in self.rows]
        table = self.tmp / "typed.parquet"
        pyarrow.parquet.write_table(pyarrow.table({
            "filename": pyarrow.array(["/" + names[0]] + names[1:]).dictionary_encode(),
            "width": pyarrow.array([float(r["width"]) for r in self.rows[:-1]] + [64.5]),
            "height": pyarrow.array([str(r["height"]) for r in self.rows]),
            "caption": pyarrow.array(["  padded  ", "\t", None, "c", "d"], pyarrow.large_string()),
            "alt": ["unused", "alt text", "alt 2", "unused", "unused"]}), table)
        index = self.backend(table, caption_strategy="parquet",
                             parquet={"fallback_caption_column": "alt"}).refresh_index(False)
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertEqual(len(reasons), len(names), reasons)  # text heights: every row refused
        self.assertIn("'width' x 'height' is 64.0 x '64'", reasons[names[0]])
        self.assertIn("'width' x 'height' is 64.5 x '96'", reasons["rot.jpg"])
        heights = [r["height"] for r in self.rows]
        pyarrow.parquet.write_table(pyarrow.table({
            "filename": pyarrow.array(["/" + names[0]] + names[1:]).dictionary_encode(),
            "width": pyarrow.array([float(r["width"]) for r in self.rows[:-1]] + [64.5]),
            "height": pyarrow.array(heights, pyarrow.int16()),
            "caption": pyarrow.array(["  padded  ", "\t", None, "c", "d"], pyarrow.large_string()),
            "alt": ["unused", "alt text", "alt 2", "unused", "unused"]}), table)
        backend = self.backend(table, output="out-typed", caption_strategy="parquet",
                               parquet={"fallback_caption_column": "alt"})
        index = backend.refresh_index(False)
        self.assertEqual([s.path for s in index.skipped], ["rot.jpg"])
        self.assertEqual(dict(index.original_sizes)[names[0]], (64, 64))
        self.assertEqual([backend.caption_for(n) for n in names[:4]],
                         ["padded", "alt text", "alt 2", "c"])

    def test_a_trusted_table_is_the_file_list(self):
        write(self.data, "unlisted.png", encode(image(64, 64), "PNG"))  # in the folder only
        rows = self.rows + [{"filename": "/gone.png", "width": 64, "height": 64, "caption": "x"},
                            {"filename": "", "width": 64, "height": 64, "caption": "x"}]
        table = write_table(self.tmp / "meta.jsonl", rows)
        listed = {s.path: s.reason for s in self.backend(table).refresh_index(False).skipped}
        self.assertIn("no row in the metadata table", listed["unlisted.png"])
        trusted = {"caption_strategy": "parquet", "parquet": {"trust_table": True}}
        backend = self.backend(table, output="out-trusted", **trusted)
        with self.assertLogs("simpletuner", "INFO") as logs:
            index = backend.refresh_index(False)
        self.assertIn("parquet.trust_table", "\n".join(logs.output))
        trained = sorted(s for ids in index.buckets.values() for s in ids)
        self.assertEqual(trained, sorted([r["filename"] for r in self.rows] + ["gone.png"]))
        self.assertEqual([s.path for s in index.skipped], ["<row 6>"])
        vae = self.tmp / "vae-trusted"
        cached = cache_latents(index, LatentSettings("photos", backend.storage, vae, "m"),
                               lambda pixels: F.avg_pool2d(pixels, 8), progress=False)
        self.assertEqual(list(cached.failures), ["gone.png"])
        self.assertIn("FileNotFoundError", cached.failures["gone.png"])
        again = self.backend(table, output="out-trusted", **trusted)
        self.assertEqual(again.refresh_index(False).digest(), index.digest())
        self.assertEqual(again.last_refresh.reused, len(trained))

    def test_the_index_is_reused_until_the_table_or_the_files_change(self):
        table = write_table(self.tmp / "meta.parquet", self.rows)
        backend = self.backend(table)
        first = backend.refresh_index(False)
        self.assertEqual(self.backend(table).refresh_index(False).digest(), first.digest())
        self.rows[0]["width"] = 128  # a.png is now listed as 128 x 64
        write_table(table, self.rows)
        edited = self.backend(table).refresh_index(False)
        self.assertIn("a.png", edited.buckets["128x64"])
        (self.data / "d.png").unlink()
        gone = self.backend(table).refresh_index(False)
        self.assertNotIn("d.png", [s for ids in gone.buckets.values() for s in ids])
        self.assertIn("no such image", {s.path: s.reason for s in gone.skipped}["d.png"])

    def test_a_missing_column_names_it_and_the_columns_there_are(self):
        table = write_table(self.tmp / "meta.parquet", self.rows)
        with self.assertRaises(TableFormatError) as caught:
            self.backend(table, parquet={"width_column": "w"}).refresh_index(False)
        self.assertIn("no column 'w' (it has filename, width, height, caption)",
                      str(caught.exception))

    def test_a_million_rows_index_without_reading_an_image(self):
        count = 1_000_000
        names = [f"shard{i % 100:03d}/img{i:07d}.jpg" for i in range(count)]
        widths = [512 + 64 * (i % 40) for i in range(count)]
        table = self.tmp / "million.parquet"
        pyarrow.parquet.write_table(pyarrow.table(
            {"filename": names, "width": widths, "height": [768] * count}), table)
        dataset = DatasetConfig(id="million", instance_data_dir=str(self.data),
                                metadata_backend="parquet", parquet={"path": str(table)},
                                caption_strategy="filename")
        training = training_config(self.tmp / "out-million", resolution=1024,
                                   aspect_bucket_alignment=64)
        storage = ListedOnly(names)
        backend = MetadataBackend(dataset, training, storage, self.tmp / "cache",
                                  TableSource(storage, dataset))
        started = time.perf_counter()
        index = backend.refresh_index(show_progress=False)
        elapsed = time.perf_counter() - started
        self.assertEqual(index.sample_count, count, index.skipped[:3])
        self.assertEqual(index.skipped, [])
        self.assertGreater(len(index.buckets), 10)
        self.assertLess(elapsed, 60, "a table index should not take minutes")


    def test_a_shuffled_table_of_many_rows_gives_the_index_of_the_ordered_one(self):
        count = 150_000  # a listing looked up in parts, one per core
        names = [f"shard{i % 7}/img{i:06d}.jpg" for i in range(count)]
        ordered = {"filename": names, "width": [512 + 64 * (i % 9) for i in range(count)],
                   "height": [768] * count}
        shuffled = {key: [values[(i * 7919) % count] for i in range(count)]  # 7919 is prime
                    for key, values in ordered.items()}
        without_row = shuffled["filename"][1]
        shuffled["filename"][:2] = ["/" + shuffled["filename"][0], "not/listed.jpg"]
        indexes = {}
        for name, columns in (("ordered", ordered), ("shuffled", shuffled)):
            table = self.tmp / f"{name}.parquet"
            pyarrow.parquet.write_table(pyarrow.table(columns), table)
            dataset = DatasetConfig(id="many", instance_data_dir=str(self.data),
                                    metadata_backend="parquet", parquet={"path": str(table)},
                                    caption_strategy="filename")
            storage = ListedOnly(names)
            training = training_config(self.tmp / name, resolution=1024,
                                       aspect_bucket_alignment=64)
            backend = MetadataBackend(dataset, training, storage, self.tmp / name / "cache",
                                      TableSource(storage, dataset))
            indexes[name] = backend.refresh_index(show_progress=False)
        self.assertEqual(indexes["ordered"].sample_count, count)
        self.assertEqual({key: [i for i in ids if i != without_row]
                          for key, ids in indexes["ordered"].buckets.items()},
                         {key: list(ids) for key, ids in indexes["shuffled"].buckets.items()})
        self.assertEqual({s.path: s.reason.split(": ", 1)[-1]
                          for s in indexes["shuffled"].skipped},
                         {"not/listed.jpg": "no such image in memory://listed-only",
                          without_row: f"no row in the metadata table {self.tmp}/shuffled.parquet"})


class LookupTest(unittest.TestCase):
    def test_each_name_gets_its_first_position_whichever_part_holds_it(self):
        known = ["a", "b", "c", "b", "d", "a", "e", "ü"]  # stems: the same one may recur
        names = ["a", "b", "d", "e", "x", None, "c", "ü", "a"]
        expected = [known.index(n) if n in known else NOT_LISTED for n in names]
        for part_size, threads in product((1, 2, 3, len(known), len(known) + 5), (1, 2, 3)):
            with self.subTest(part_size=part_size, threads=threads):
                found = positions_in(pyarrow.array(names, pyarrow.string()),
                                     pyarrow.array(known, pyarrow.string()), threads, part_size)
                self.assertEqual(found.tolist(), expected)
        for look_up in (positions_in, positions_in_sorted):
            self.assertEqual(look_up(pyarrow.array(["a", None]), pyarrow.array([], "string"),
                                     2).tolist(), [NOT_LISTED] * 2)

    def test_a_sorted_listing_is_probed_part_by_part_with_the_names_in_each_range(self):
        known = sorted(["a.png", "a/b.png", "b.png", "c d.png", "z.png", "ä.png", "é/x.png",
                        "\U0001f600.png", "\ud800.png"])  # by code point, as a listing is
        names = pyarrow.chunked_array([[known[5], None, "0.png", known[0], "zz.png"],
                                       [known[-1], "b.png", known[3], "é/x.pn", known[8]],
                                       [], [known[5], known[1]]], pyarrow.string())
        expected = [known.index(n) if n in known else NOT_LISTED for n in names.to_pylist()]
        known_arrow = arrow_strings(StringColumn.encode(known))
        for part_size, threads in product((1, 2, 3, 4, len(known), len(known) + 3), (1, 2, 5)):
            with self.subTest(part_size=part_size, threads=threads):
                self.assertEqual(positions_in_sorted(names, known_arrow, threads,
                                                     part_size).tolist(), expected)
        self.assertEqual(positions_in_sorted(names.slice(0, 0), known_arrow, 2, 2).tolist(), [])


class ColumnChecksTest(unittest.TestCase):
    """The whole-column checks a table's rows go through before a cell becomes a Python str."""

    def test_the_listing_becomes_arrow_strings_with_every_boundary_kept(self):
        for ids in (["ab", "c"], ["a", "bc"], ["", "ü", "", "\U0001f600"], [],
                    [f"d{i % 5}/img_{i:06d}.png" for i in range(300_000)]):
            with self.subTest(count=len(ids)):
                strings = arrow_strings(StringColumn.encode(ids))
                self.assertEqual(strings.type, pyarrow.string())
                self.assertEqual(strings.to_pylist(), ids)

    def test_captions_are_trimmed_and_blank_ones_null_and_trimmed_ones_not_copied(self):
        cells = ["plain", " lead", "trail\n", "\u3000wide\u00a0", "ünï", "", "  ", None, "x"]
        chosen = caption_text([pyarrow.array(cells)])
        self.assertEqual(chosen.to_pylist(),
                         [c.strip() or None if c is not None else None for c in cells])
        with_fallback = caption_text([pyarrow.array(cells), pyarrow.array(["alt"] * len(cells))])
        self.assertEqual(with_fallback.to_pylist()[5:8], ["alt", "alt", "alt"])
        trimmed = pyarrow.array(["a photo", None, "of a thing."] * 1000)[1:]
        same = caption_text([trimmed])
        self.assertEqual(same.to_pylist(), trimmed.to_pylist())
        self.assertEqual(same.buffers()[2].address, trimmed.buffers()[2].address)


if __name__ == "__main__":
    unittest.main()
