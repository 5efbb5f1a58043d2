"""Discovery: sizes from headers, skip reasons, the cache (order independence, invalidation,
incremental updates), listing rules and captions, on images generated in a temporary folder."""

from __future__ import annotations

import os
import random
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
from PIL import Image, ImageFile

from discovery_fixtures import (
    dataset_config, encode, image, rotated_jpeg, touch_later, training_config, write,
)
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.metadata.backends import discovery, probe_pool
from simpletuner.helpers.metadata.index_columns import StringColumn
from simpletuner.helpers.metadata.index_file import read_columns, write_columns
from simpletuner.helpers.metadata.split import SortedIds
from simpletuner.helpers.metadata.backends.base import MetadataBackend, MetadataCacheError
from simpletuner.helpers.metadata.backends.bucketing import MISSING_CAPTION


def shuffled_directory_order(seed: int):
    """Patch the listing's os.scandir to return each folder's entries in a shuffled order."""
    real_scandir = os.scandir
    shuffler = random.Random(seed)

    def shuffled_scandir(path):
        entries = list(real_scandir(path))
        shuffler.shuffle(entries)
        return iter(entries)

    return mock.patch("simpletuner.helpers.data_backend.local.os.scandir", shuffled_scandir)


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "data"
        self.data.mkdir()
        self.output = self.root / "output"
        self.reads: list[str] = []

    def backend(self, dataset_overrides=None, training_overrides=None, output=None) -> MetadataBackend:
        training = training_config(output or self.output, **(training_overrides or {}))
        dataset = dataset_config(self.data, **(dataset_overrides or {}))
        return MetadataBackend.from_config(dataset, training)

    def refresh(self, backend: MetadataBackend):
        """Run refresh_index while recording every path whose header is read."""
        real = probe_pool.probe_images

        def counting(paths, **kwargs):
            self.reads.extend(Path(p).relative_to(self.data).as_posix() for p in paths)
            return real(paths, **kwargs)

        with mock.patch.object(probe_pool, "probe_images", counting):
            return backend.refresh_index(show_progress=False)


class HeaderSizeTest(TempDirTest):
    def test_colour_modes_and_formats_give_their_size(self):
        files = {
            "cmyk.jpg": encode(image(120, 80, "CMYK"), "JPEG"),
            "palette.png": encode(image(80, 120, "P"), "PNG", transparency=0),
            "sixteen.png": encode(Image.new("I;16", (96, 64), 4000), "PNG"),
            "gray.jpg": encode(image(64, 64, "L"), "JPEG"),
            "rgba.webp": encode(image(100, 50, "RGBA"), "WEBP"),
            "plain.bmp": encode(image(50, 100), "BMP"),
            "plain.tiff": encode(image(70, 70), "TIFF"),
        }
        expected = {"cmyk.jpg": (120, 80), "palette.png": (80, 120), "sixteen.png": (96, 64),
                    "gray.jpg": (64, 64), "rgba.webp": (100, 50), "plain.bmp": (50, 100),
                    "plain.tiff": (70, 70)}
        for name, data in files.items():
            write(self.data, name, data)
        # Really 16 bits per pixel (Pillow 10.1, the floor, reads such a PNG back as mode "I").
        self.assertIn(Image.open(self.data / "sixteen.png").mode, ("I;16", "I"))
        index = self.refresh(self.backend())
        self.assertEqual(index.skipped, [])
        self.assertEqual(index.original_sizes, expected)

    def test_exif_rotation_swaps_width_and_height(self):
        # Stored landscape 96x64; orientations 5-8 turn it portrait, 1-4 keep it landscape.
        for orientation in range(1, 9):
            write(self.data, f"o{orientation}.jpg", rotated_jpeg(96, 64, orientation))
        index = self.refresh(self.backend())
        for orientation in range(1, 9):
            portrait = orientation >= 5
            self.assertEqual(index.original_sizes[f"o{orientation}.jpg"],
                             (64, 96) if portrait else (96, 64))
        # resolution 64, alignment 16: 96x64 -> 96x64, its portrait twin -> 64x96
        self.assertEqual(index.buckets["64x96"], ["o5.jpg", "o6.jpg", "o7.jpg", "o8.jpg"])
        self.assertEqual(index.buckets["96x64"], ["o1.jpg", "o2.jpg", "o3.jpg", "o4.jpg"])

    def test_header_only(self):
        # A JPEG whose pixel data is replaced by garbage keeps its header and its end marker:
        # only a full decode could tell, and discovery must not decode.
        data = bytearray(encode(image(200, 100), "JPEG"))
        start = len(data) // 2
        data[start:-2] = bytes(len(data) - start - 2)
        write(self.data, "garbled.jpg", bytes(data))
        write(self.data, "plain.png", encode(image(64, 128), "PNG"))
        decoded = []
        real_load = ImageFile.ImageFile.load

        def recording_load(im):
            decoded.append(im.format)
            return real_load(im)

        with mock.patch.object(ImageFile.ImageFile, "load", recording_load):
            index = self.refresh(self.backend())
        self.assertEqual(decoded, [])
        self.assertEqual(index.original_sizes, {"garbled.jpg": (200, 100), "plain.png": (64, 128)})


class SkipReasonTest(TempDirTest):
    def test_every_broken_kind_is_reported_with_its_reason(self):
        good = encode(image(96, 64), "JPEG")
        png = encode(image(96, 64), "PNG")
        write(self.data, "good.jpg", good)
        write(self.data, "empty.jpg", b"")
        write(self.data, "text.jpg", b"this is a text file, not a picture\n" * 10)
        write(self.data, "header_cut.png", png[:20])
        write(self.data, "data_cut.jpg", good[: len(good) // 2])
        write(self.data, "data_cut.png", png[: len(png) // 2])
        write(self.data, "bomb.png", encode(image(300, 300), "PNG"))
        write(self.data, "tiny.png", encode(image(40, 20), "PNG"))
        write(self.data, "panorama.jpg", encode(image(400, 64), "JPEG"))
        write(self.data, "uncaptioned.jpg", good, caption=None)
        backend = self.backend({"minimum_image_size": 32, "maximum_aspect_ratio": 3.0})
        with mock.patch.object(Image, "MAX_IMAGE_PIXELS", 200 * 200):
            index = self.refresh(backend)
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertEqual(index.buckets, {"96x64": ["good.jpg"]})
        # Sizes are given for indexed files only, whether unreadable or filtered out.
        self.assertEqual(dict(index.original_sizes), {"good.jpg": (96, 64)})
        self.assertEqual(len(index.original_sizes), 1)
        self.assertNotIn("tiny.png", index.original_sizes)
        self.assertEqual(len(index.skipped), len(reasons))  # each once
        self.assertEqual(reasons["empty.jpg"], discovery.ZERO_BYTE)
        self.assertEqual(reasons["text.jpg"], discovery.NOT_AN_IMAGE)
        self.assertEqual(reasons["header_cut.png"], discovery.BAD_HEADER)
        self.assertEqual(reasons["data_cut.jpg"], discovery.TRUNCATED_DATA)
        self.assertEqual(reasons["data_cut.png"], discovery.TRUNCATED_DATA)
        self.assertIn("decompression-bomb", reasons["bomb.png"])
        self.assertIn("40000", reasons["bomb.png"])
        self.assertTrue(reasons["tiny.png"].startswith("too small"))
        self.assertTrue(reasons["panorama.jpg"].startswith("aspect ratio"))
        self.assertEqual(reasons["uncaptioned.jpg"], MISSING_CAPTION)
        self.assertEqual(len(reasons), 9)

    def test_far_over_the_limit_is_a_skip_too(self):
        # Over twice the limit Pillow raises instead of warning.
        write(self.data, "huge.png", encode(image(300, 300), "PNG"))
        with mock.patch.object(Image, "MAX_IMAGE_PIXELS", 1000):
            index = self.refresh(self.backend())
        self.assertEqual(index.buckets, {})
        self.assertIn("decompression-bomb", index.skipped[0].reason)

    def test_data_after_the_end_marker_is_not_truncation(self):
        good = encode(image(96, 64), "JPEG") + b"\x00appended by some camera" * 400
        write(self.data, "trailer.jpg", good)
        index = self.refresh(self.backend())
        self.assertEqual(index.buckets, {"96x64": ["trailer.jpg"]})

    def test_caption_is_only_required_by_textfile(self):
        write(self.data, "a_red_fox.jpg", encode(image(64, 64), "JPEG"), caption=None)
        self.assertEqual(self.refresh(self.backend()).sample_count, 0)
        backend = self.backend({"caption_strategy": "filename"})
        self.assertEqual(self.refresh(backend).buckets, {"64x64": ["a_red_fox.jpg"]})
        self.assertEqual(backend.caption_for("a_red_fox.jpg"), "a red fox")


class ListingTest(TempDirTest):
    def test_rules_for_names_folders_and_links(self):
        data = encode(image(64, 64), "PNG")
        for name in ["a.png", "UPPER.JPG", "sub/b.jpeg", "sub/deeper/c.webp", ".hidden.png",
                     ".secret/d.png", "notes.gif", "sub/readme.md"]:
            write(self.data, name, data, caption=None)
        (self.data / "sub" / "loop").symlink_to(self.data, target_is_directory=True)
        (self.data / "link.png").symlink_to(self.data / "a.png")
        (self.data / "dangling.png").symlink_to(self.data / "missing.png")
        listing = LocalStorage(self.data).list_files()
        self.assertEqual(listing.sample_ids,
                         ["UPPER.JPG", "a.png", "link.png", "sub/b.jpeg", "sub/deeper/c.webp"])
        self.assertEqual([path for path, _ in listing.unreadable], ["dangling.png"])
        self.assertEqual(listing.sizes[1], len(data))
        self.assertEqual(listing.change_keys[1], (self.data / "a.png").stat().st_mtime_ns)

    def test_columns_stay_aligned_whatever_the_directory_order(self):
        for i in range(30):
            write(self.data, f"d{i % 4}/f{i:02d}.png", b"x" * (100 + i), caption=None)
        with shuffled_directory_order(seed=5):
            listing = LocalStorage(self.data).list_files()
        self.assertEqual(listing.sample_ids, sorted(listing.sample_ids))
        self.assertEqual(len(listing.sample_ids), 30)
        for sample_id, size, mtime_ns in zip(listing.sample_ids, listing.sizes,
                                             listing.change_keys):
            stat = (self.data / sample_id).stat()
            self.assertEqual((size, mtime_ns), (stat.st_size, stat.st_mtime_ns), sample_id)

    def test_read_and_exists(self):
        write(self.data, "x/y.png", b"bytes!", caption=None)
        backend = LocalStorage(self.data)
        self.assertTrue(backend.exists("x/y.png"))
        self.assertFalse(backend.exists("x/z.png"))
        self.assertEqual(backend.read_bytes("x/y.png"), b"bytes!")
        self.assertEqual(backend.read_range("x/y.png", 1, 3), b"yte")
        backend.write_atomic("x/new.png", b"new")
        self.assertEqual(backend.versions(["x/new.png", "x/z.png"])["x/new.png"].size, 3)
        self.assertEqual(list(backend.versions(["x/z.png"])), [])


class CacheTest(TempDirTest):
    def populate(self, count=12):
        rng = random.Random(3)
        for i in range(count):
            w, h = rng.choice([(96, 64), (64, 96), (64, 64), (128, 64)])
            write(self.data, f"dir{i % 3}/img{i:02d}.png", encode(image(w, h, seed=i), "PNG"),
                  caption=f"caption {i}")
        write(self.data, "broken.jpg", b"nope")

    def test_index_does_not_depend_on_listing_order(self):
        self.populate()
        first = self.backend(output=self.root / "out1")
        self.refresh(first)
        second = self.backend(output=self.root / "out2")
        with shuffled_directory_order(seed=11):
            self.refresh(second)
        self.assertEqual(first.cache_path.read_bytes(), second.cache_path.read_bytes())
        self.assertEqual(first.load_index().digest(), second.load_index().digest())

    def test_unchanged_folder_reads_nothing_and_keeps_the_cache_file(self):
        self.populate()
        backend = self.backend()
        index = self.refresh(backend)
        self.assertEqual(len(self.reads), 13)
        before = backend.cache_path.stat().st_mtime_ns
        self.reads.clear()
        again = self.refresh(self.backend())
        self.assertEqual(self.reads, [])
        self.assertEqual(again, index)
        self.assertEqual(backend.cache_path.stat().st_mtime_ns, before)

    def test_added_deleted_and_modified_files(self):
        self.populate()
        self.refresh(self.backend())
        self.reads.clear()
        write(self.data, "new.png", encode(image(64, 96), "PNG"))
        (self.data / "dir0" / "img00.png").unlink()
        changed = self.data / "dir1" / "img01.png"
        changed.write_bytes(encode(image(128, 64, seed=99), "PNG"))
        touch_later(changed)
        backend = self.backend()
        index = self.refresh(backend)
        self.assertEqual(sorted(self.reads), ["dir1/img01.png", "new.png"])
        self.assertEqual(backend.last_refresh.read, 2)
        self.assertEqual(backend.last_refresh.forgotten, 1)
        self.assertNotIn("dir0/img00.png", index.original_sizes)
        self.assertIn("new.png", index.buckets["64x96"])
        self.assertEqual(index.original_sizes["dir1/img01.png"], (128, 64))
        self.assertEqual([s.path for s in index.skipped], ["broken.jpg"])  # carried over
        self.assertEqual(backend.load_index(), index)
        for built in (index, backend.load_index()):
            for bucket in built.buckets.values():
                self.assertIsInstance(bucket, SortedIds)
                self.assertEqual(bucket, sorted(bucket))

    def test_a_repaired_file_leaves_the_skip_list(self):
        self.populate(3)
        self.assertEqual([s.path for s in self.refresh(self.backend()).skipped], ["broken.jpg"])
        repaired = write(self.data, "broken.jpg", encode(image(64, 64), "JPEG"))
        touch_later(repaired)
        index = self.refresh(self.backend())
        self.assertEqual(index.skipped, [])
        self.assertIn("broken.jpg", index.buckets["64x64"])
        self.assertEqual(index.original_sizes["broken.jpg"], (64, 64))

    def test_settings_change_rebuckets_without_reading(self):
        self.populate()
        backend = self.backend()
        index = self.refresh(backend)
        self.reads.clear()
        bigger = self.backend(training_overrides={"resolution": 128})
        with self.assertRaises(MetadataCacheError):
            bigger.load_index()  # written for resolution 64
        rebucketed = self.refresh(bigger)
        self.assertEqual(self.reads, [])
        self.assertNotEqual(sorted(rebucketed.buckets), sorted(index.buckets))
        self.assertEqual(sorted(rebucketed.buckets), ["128x128", "128x192", "192x128", "256x128"])
        self.assertEqual(bigger.load_index(), rebucketed)

    def test_bomb_limit_change_rereads(self):
        self.populate(3)
        self.refresh(self.backend())
        self.reads.clear()
        with mock.patch.object(Image, "MAX_IMAGE_PIXELS", 5000):
            index = self.refresh(self.backend())
        self.assertEqual(len(self.reads), 4)
        self.assertGreater(len(index.skipped), 1)

    def test_corrupt_or_missing_cache(self):
        self.populate(3)
        backend = self.backend()
        with self.assertRaises(MetadataCacheError):
            backend.load_index()
        index = self.refresh(backend)
        backend.cache_path.unlink()  # a new file: the index above keeps its mapping
        backend.cache_path.write_bytes(b"{ not an index file")
        self.reads.clear()
        with self.assertLogs("simpletuner.helpers.metadata.backends.base", "WARNING") as logs:
            self.assertEqual(self.refresh(self.backend()), index)
        self.assertIn("not an index file", logs.output[0])
        self.assertEqual(len(self.reads), 4)
        self.assertEqual(read_columns(backend.cache_path)[0]["dataset_id"], "photos")

    def test_malformed_bucket_rows_are_refused_by_load_index(self):
        self.populate()
        backend = self.backend()
        self.refresh(backend)
        meta, columns = read_columns(backend.cache_path)
        good = {name: np.array(values) for name, values in columns.items()}
        for damage in (lambda rows: rows.__setitem__(slice(None), rows[::-1].copy()),
                       lambda rows: rows.__setitem__(-1, 10 ** 6),
                       lambda rows: rows.__setitem__(0, -1)):
            damaged = {name: values.copy() for name, values in good.items()}
            damage(damaged["bucket_rows"])  # written whole: only the rows are wrong
            write_columns(backend.cache_path, meta, damaged)
            with self.assertRaisesRegex(MetadataCacheError, "malformed index"):
                self.backend().load_index()

    def test_a_cache_edited_out_of_order_is_refused_not_trusted(self):
        self.populate()
        backend = self.backend()
        index = self.refresh(backend)
        meta, columns = read_columns(backend.cache_path)
        column = StringColumn(columns["id_bytes"], columns["id_starts"])
        ids = column.many(np.arange(len(column)))
        first, second = ids.index(index.buckets["64x64"][0]), ids.index(index.buckets["64x64"][1])
        ids[first], ids[second] = ids[second], ids[first]  # rows still ascend, ids do not
        swapped = StringColumn.encode(ids)
        write_columns(backend.cache_path, meta, {**columns, "id_bytes": swapped.blob,
                                                 "id_starts": swapped.starts})
        # It keeps the digest recorded for the main rank's content: the main rank must not
        # take its rows, nor keep them in the index the other ranks load.
        self.reads.clear()
        with self.assertLogs("simpletuner.helpers.metadata.backends.base", "WARNING") as logs:
            self.assertEqual(self.refresh(self.backend()).digest(), index.digest())
        self.assertIn("the ids of the file table are not ascending strings", logs.output[0])
        self.assertEqual(len(self.reads), 13)  # the main rank rebuilt it from the images
        self.assertEqual(self.backend().load_index(), index)

    def test_cache_with_misaligned_columns_is_rebuilt(self):
        self.populate(3)
        backend = self.backend()
        index = self.refresh(backend)
        meta, columns = read_columns(backend.cache_path)
        write_columns(backend.cache_path, meta, {**columns, "width": columns["width"][:-1]})
        with self.assertLogs("simpletuner.helpers.metadata.backends.base", "WARNING") as logs:
            with self.assertRaises(MetadataCacheError):
                self.backend().load_index()
            self.reads.clear()
            self.assertEqual(self.refresh(self.backend()), index)
        self.assertIn("differ in length", "\n".join(logs.output))
        self.assertEqual(len(self.reads), 4)
        self.assertEqual(self.backend().load_index(), index)


class CaptionTest(TempDirTest):
    def test_strategies(self):
        write(self.data, "sub/my_cat.png", encode(image(64, 64), "PNG"), caption="  a cat\n")
        self.assertEqual(self.backend().caption_for("sub/my_cat.png"), "a cat")
        self.assertEqual(self.backend({"caption_strategy": "filename"}).caption_for("sub/my_cat.png"),
                         "my cat")
        backend = self.backend({"caption_strategy": "instanceprompt", "instance_prompt": "sks cat"})
        self.assertEqual(backend.caption_for("sub/my_cat.png"), "sks cat")

    def test_square_crop_dataset_uses_one_bucket(self):
        write(self.data, "wide.png", encode(image(128, 64), "PNG"))
        write(self.data, "tall.png", encode(image(64, 128), "PNG"))
        index = self.refresh(self.backend({"crop": True, "crop_aspect": "square"}))
        self.assertEqual(index.buckets, {"64x64": ["tall.png", "wide.png"]})


if __name__ == "__main__":
    unittest.main()
