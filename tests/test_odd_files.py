"""Odd files, on disk with those names and sizes: names that are not UTF-8 (b'caf\\xe9.png' on
Linux) are indexed, trained and reported; absurd shapes (a 20000x20 strip) are skipped with the
reason. Through discovery, the index cache, `plan --json`, the skipped-files report, the audit
and a real training run with a trace."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

from PIL import Image

from discovery_fixtures import dataset_config, training_config
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.backends.bucketing import MISSING_CAPTION
from simpletuner.helpers.metadata.buckets import (MAX_BUCKET_AREA_FACTOR, BucketSettings,
                                                  SizeFilters, drawn_aspect, parse_bucket_key)
from simpletuner.helpers.metadata.index_file import read_columns
from simpletuner.helpers.metadata.skipped import SkippedFile
from simpletuner.helpers.metadata.split import (DatasetSpec, UndersizedBucketsError,
                                                check_bucket_sizes)
from simpletuner.helpers.metadata.startup import report_skipped_files
from simpletuner.helpers.metadata.subset import limit_samples
from launching import run_bounded
from training_fixtures import (environment, make_shapes, read_jsonl, run_in_process_logged,
                               write_config)

CAFE = "caf\udce9.png"              # what os.scandir gives for b'caf\xe9.png'
IN_ODD_FOLDER = "\udcff\udcfe/x.png"  # b'\xff\xfe/x.png': a folder that is not UTF-8 either
STRIP, TALL = "strip \udce9.png", "tall.png"  # 20000x20 and 20x20000, one colour: a few KB
DEFAULT_LIMIT = "aspect ratio (W/H) outside [0.125, 8] (the default limit"


def write_named(folder: Path, name: bytes, size: tuple[int, int], caption: bytes | None) -> None:
    """A PNG (and its caption) under the byte name ``name``: the filesystem gets those bytes."""
    path = os.path.join(os.fsencode(folder), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new("RGB", size, (200, 40, 40)).save(os.fsdecode(path), format="PNG")
    if caption is not None:
        with open(path[:-len(b".png")] + b".txt", "wb") as handle:
            handle.write(caption)


def write_odd_names(folder: Path, size: tuple[int, int] = (64, 64)) -> None:
    write_named(folder, b"caf\xe9.png", size, b"a red square in a cafe")
    write_named(folder, b"\xff\xfe/x.png", size, b"a red square")


def write_strips(folder: Path) -> None:
    write_named(folder, b"strip \xe9.png", (20000, 20), b"a very long red line")
    write_named(folder, b"tall.png", (20, 20000), b"a very tall red line")


def run_audit(config: Path, output: Path, root: Path, epochs: int):
    return run_bounded([sys.executable, "-m", "simpletuner.audit", "--config", str(config),
                        "--output", str(output), "--epochs", str(epochs)],
                       tmpdir=root, timeout=300, env=environment(str(root)))


class NonUtf8NameDiscoveryTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "data"
        write_odd_names(self.data)
        write_named(self.data, b"plain.png", (64, 64), b"a plain one")
        write_named(self.data, b"no caption \xe9.png", (64, 64), None)

    def backend(self) -> MetadataBackend:
        return MetadataBackend.from_config(dataset_config(self.data),
                                           training_config(self.root / "output"))

    def test_indexed_with_their_captions_and_the_cache_round_trips(self):
        main = self.backend()
        index = main.refresh_index(show_progress=False)
        self.assertEqual(list(index.buckets["64x64"]), sorted([CAFE, IN_ODD_FOLDER, "plain.png"]))
        header, columns = read_columns(main.cache_path)  # the skips as columns, reasons once
        self.assertEqual(header["skipped_reasons"], [MISSING_CAPTION])
        self.assertEqual(columns["skipped_path_bytes"].tobytes(),
                         "no caption \udce9.png".encode("utf-8", "surrogatepass"))
        other_rank = self.backend()
        loaded = other_rank.load_index()  # the name's very bytes come back
        self.assertEqual(list(loaded.skipped), [SkippedFile("no caption \udce9.png",
                                                            MISSING_CAPTION)])
        self.assertEqual(loaded.buckets, index.buckets)
        self.assertEqual(loaded.digest(), index.digest())
        self.assertEqual(other_rank.caption_for(CAFE), "a red square in a cafe")
        self.assertEqual(other_rank.caption_for(IN_ODD_FOLDER), "a red square")

    def test_a_skipped_one_is_reported_in_json_and_named_printably_in_the_log(self):
        index = self.backend().refresh_index(show_progress=False)
        with self.assertLogs("simpletuner.helpers.metadata.startup", "WARNING") as logs:
            path = report_skipped_files({"photos": index}, self.root)
        report = json.loads(path.read_bytes().decode("utf-8"))
        self.assertEqual(report, {"photos": [{"path": "no caption \udce9.png",
                                              "reason": MISSING_CAPTION}]})
        self.assertIn("photos: no caption \\xe9.png: missing caption", "\n".join(logs.output))

    def test_subset_digests_hash_the_file_name_bytes(self):
        index = self.backend().refresh_index(show_progress=False)
        kept = limit_samples(index, 1)
        digest = {s: hashlib.sha256(b"photos\x00" + os.fsencode(s)).digest()
                  for s in index.buckets["64x64"]}
        self.assertEqual(list(kept.buckets["64x64"]), [min(digest, key=digest.get)])

    def test_plan_json_prints_them(self):
        config = write_config(self.root, self.data, datasets=[
            {"id": "photos", "instance_data_dir": str(self.data), "caption_strategy": "textfile"}])
        result = run_bounded([sys.executable, "-m", "simpletuner", "plan", "--config",
                              str(config), "--json"], tmpdir=self.root, timeout=300,
                             env=environment(str(self.root)))
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        plan = json.loads(result.stdout)["datasets"]["photos"]
        self.assertIn(CAFE, plan["buckets"]["64x64"])
        self.assertEqual(plan["skipped"][0]["path"], "no caption \udce9.png")

    def test_the_audit_traces_and_checks_them(self):
        config = write_config(self.root, self.data, datasets=[  # E = 1: nothing is trimmed
            {"id": "photos", "instance_data_dir": str(self.data), "caption_strategy": "textfile"}],
            train_batch_size=1)
        audit = self.root / "audit"
        result = run_audit(config, audit, self.root, epochs=3)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("0 missing, 0 duplicated", result.stdout)
        traced = {s for r in read_jsonl(audit / "rank-0.jsonl") for s in r["samples"]}
        self.assertEqual(traced, {CAFE, IN_ODD_FOLDER, "plain.png"})
        plan = json.loads((audit / "plan.json").read_bytes().decode("utf-8"))
        self.assertIn(CAFE, plan["datasets"]["photos"]["buckets"]["64x64"])


class AbsurdShapeDiscoveryTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        self.data = self.root / "data"
        self.ids = make_shapes(self.data, per_size=4, sizes=((64, 64),))
        write_strips(self.data)

    def refresh(self, training=None, **dataset):
        backend = MetadataBackend.from_config(dataset_config(self.data, **dataset),
                                              training_config(self.root / "out", **(training or {})))
        index = backend.refresh_index(show_progress=False)
        return index, {s.path: s.reason for s in index.skipped}, backend.bucket_settings

    def assert_no_oversized_bucket(self, index, settings: BucketSettings):
        for key in index.buckets:
            width, height = parse_bucket_key(key)
            self.assertLessEqual(width * height, MAX_BUCKET_AREA_FACTOR * settings.training_area)

    def test_by_default_beyond_8_to_1_is_skipped_with_the_reason(self):
        write_named(self.data, b"wide8.png", (512, 64), b"exactly 8:1")  # the limit is inclusive
        index, reasons, settings = self.refresh()
        self.assertEqual(set(reasons), {STRIP, TALL})
        for reason in reasons.values():
            self.assertTrue(reason.startswith(DEFAULT_LIMIT), reason)
        self.assertEqual(index.buckets, {"64x64": self.ids, "512x64": ["wide8.png"]})
        for zero_is_off in ({"maximum_aspect_ratio": 0}, {"minimum_aspect_ratio": 0}):
            self.assertEqual(self.refresh(**zero_is_off)[1], reasons)  # SimpleTuner's 0: unset

    def test_raised_limits_never_make_an_oversized_bucket(self):
        raised = {"minimum_aspect_ratio": 0.0001, "maximum_aspect_ratio": 10000}
        for kind, resolution in (("pixel", 64), ("area", 0.004096), ("pixel_area", 64)):
            with self.subTest(resolution_type=kind):
                index, reasons, settings = self.refresh(resolution_type=kind,
                                                        resolution=resolution, **raised)
                self.assertEqual(set(reasons), {STRIP, TALL})
                for reason in reasons.values():
                    self.assertIn(f"more than {MAX_BUCKET_AREA_FACTOR} x the training area",
                                  reason)
                self.assertEqual(index.buckets, {"64x64": self.ids})
                self.assert_no_oversized_bucket(index, settings)

    def test_crop_aspect_random_never_trains_an_oversized_drawn_bucket(self):
        index, reasons, settings = self.refresh(crop=True, crop_aspect="random",
                                                crop_aspect_buckets=[1.0, 40.0])
        drawn_wide = {s for s in self.ids if drawn_aspect("photos", s, settings) == 40.0}
        self.assertTrue(drawn_wide and drawn_wide != set(self.ids), drawn_wide)
        oversized = {s for s, reason in reasons.items() if "training area" in reason}
        self.assertEqual(oversized, drawn_wide)
        self.assertEqual(set(index.buckets["64x64"]), set(self.ids) - drawn_wide)
        self.assert_no_oversized_bucket(index, settings)

    def test_asking_for_wide_images_only_lifts_the_default_maximum(self):
        filters = SizeFilters.for_dataset(dataset_config(self.data, minimum_aspect_ratio=10),
                                          training_config(self.root / "out"))
        self.assertIsNone(filters.reason_to_skip(2000, 100))
        self.assertIsNotNone(filters.reason_to_skip(900, 100))

    def test_the_audit_runs_with_defaults_where_the_strip_stopped_it(self):
        config = write_config(self.root, self.data)  # E = 2; a strip bucket would have 1
        result = run_audit(config, self.root / "audit", self.root, epochs=1)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("0 missing, 0 duplicated", result.stdout)

    def test_an_undersized_bucket_names_its_files(self):
        spec = DatasetSpec("photos", {"64x64": self.ids, "64000x64": [STRIP]}, batch_size=2)
        with self.assertRaises(UndersizedBucketsError) as caught:
            check_bucket_sizes([spec], 1, 1)
        self.assertIn("bucket 64000x64: 1 samples x 1 = 1 occurrences; needs repeats >= 1 "
                      "(strip \\xe9.png)", str(caught.exception))


class OddFilesTrainingTest(unittest.TestCase):
    """One epoch of a real run: four shapes in 64x64, the two odd names alone in 80x64, and
    the two strips, which oversubscription would have extended into 64000x64 and 64x64000."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        root = Path(cls._tmp.name)
        cls.ids = make_shapes(root / "data", per_size=4, sizes=((64, 64),))
        write_odd_names(root / "data", size=(80, 64))
        write_strips(root / "data")
        config = write_config(root, root / "data", max_train_steps=3, trace_samples=True,
                              checkpointing_steps=3, allow_dataset_oversubscription=True)
        cls.result = run_in_process_logged(config, cls._tmp.name)
        cls.out = root / "config-out"

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_they_train_and_the_trace_names_them(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        records = read_jsonl(self.out / "trace" / "rank-0.jsonl")
        odd = [r["samples"] for r in records if r["bucket"] == "80x64"]
        self.assertEqual([sorted(s) for s in odd], [sorted([CAFE, IN_ODD_FOLDER])])
        trained = {s for r in records for s in r["samples"]}
        self.assertEqual(trained, set(self.ids) | {CAFE, IN_ODD_FOLDER})
        self.assertEqual(len(list((self.out / "cache" / "vae").rglob("*.safetensors"))), 6)

    def test_the_checkpoint_holds_the_index_digest_not_their_names(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        folder = self.out / "checkpoint-3"
        self.assertTrue((folder / "manifest.json").is_file())
        text = (folder / "sampler_state.json").read_bytes().decode("utf-8")
        cache = read_columns(self.out / "cache" / "metadata" / "shapes.index")[0]
        self.assertEqual(json.loads(text)["data"], {"shapes": cache["data_digest"]})
        self.assertNotIn("x.png", text)

    def test_the_strips_are_skipped_and_reported(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        records = read_jsonl(self.out / "trace" / "rank-0.jsonl")
        self.assertEqual({r["bucket"] for r in records}, {"64x64", "80x64"})
        report = json.loads((self.out / "skipped_files.json").read_bytes().decode("utf-8"))
        self.assertEqual([entry["path"] for entry in report["shapes"]], [STRIP, TALL])
        for entry in report["shapes"]:
            self.assertTrue(entry["reason"].startswith(DEFAULT_LIMIT), entry)
        self.assertIn("strip \\xe9.png: " + DEFAULT_LIMIT, self.result.stderr)


if __name__ == "__main__":
    unittest.main()
