"""Clip discovery on real clips written with PyAV: sizes (rotation applied), exact fps and frame
counts without a full decode, checked against decoding every frame; each bad kind of file
skipped with its reason in skipped_files.json; the index cache; S3 (a real rclone server) equal
to local, and a storage outage during the probes stopping the run instead of skipping clips;
the exactly-once audit in real gloo processes over clips with images mixed in."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import unittest
from fractions import Fraction
from pathlib import Path

import av
import pyarrow
import pyarrow.parquet

from discovery_fixtures import training_config, touch_later
from launching import run_bounded
from s3_server import RcloneS3Server
from test_distributed import launch
from training_fixtures import make_shapes
from simpletuner.configuration import DatasetConfig
from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.data_backend.storage import StorageError
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.backends.clip_probe import probe_clip
from simpletuner.helpers.metadata.backends.clip_source import ClipSource
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import ClipPlan
from simpletuner.helpers.metadata.startup import report_skipped_files
from video_fixtures import (decoded_frame_count, write_audio_only, write_clip, write_noisy_clip,
                            write_not_a_video, write_truncated, write_zero_length)

BUCKET, PREFIX = "media", "clips/"


def wan_training(output_dir: Path, **overrides):
    return training_config(output_dir, model_family="wan",
                           pretrained_model_name_or_path="builtin:tiny-wan", **overrides)


def clip_dataset(folder: Path, **video) -> DatasetConfig:
    return DatasetConfig(id="clips", dataset_type="video", instance_data_dir=str(folder),
                         video=video or {"bucket_strategy": "resolution_frames"})


def populate(folder: Path) -> None:
    """Good clips of three lengths and sizes, one rotated, and one file of each bad kind."""
    write_clip(folder / "walk.mp4", 64, 48, 17, fps=16)
    write_clip(folder / "wave.mkv", 64, 48, 23, fps=24)
    write_clip(folder / "phone.mp4", 64, 48, 9, fps=30, rotation=90)
    write_clip(folder / "nested/long.webm", 48, 48, 40, fps=16)
    write_clip(folder / "blink.mp4", 64, 48, 3, fps=16)
    write_truncated(folder / "cut.mp4")
    write_zero_length(folder / "empty.mp4")
    write_audio_only(folder / "tone.mp4")
    write_not_a_video(folder / "notes.mov")
    write_clip(folder / "uncaptioned.mp4", 64, 48, 9, caption=None)


EXPECTED_SKIPS = {
    "blink.mp4": "too short: 3 frames, below min_frames 5",
    "cut.mp4": "cannot be decoded (truncated, corrupt or not a video): Invalid data found when "
               "processing input",
    "empty.mp4": "zero-byte file",
    "notes.mov": "cannot be decoded (truncated, corrupt or not a video): Invalid data found "
                 "when processing input",
    "tone.mp4": "audio only: no video stream",
    "uncaptioned.mp4": "missing caption: no <name>.txt beside the file (caption_strategy "
                       "'textfile')",
}


class ClipProbeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_counts_and_rates_equal_a_full_decode_in_every_container(self):
        for suffix in (".mp4", ".mov", ".avi", ".mkv", ".webm"):
            for fps in (16, 24, Fraction(30000, 1001)):
                for frames in (1, 6, 25):
                    with self.subTest(suffix=suffix, fps=fps, frames=frames):
                        path = write_clip(self.tmp / f"grid-{frames}-{float(fps):.2f}{suffix}",
                                          48, 32, frames, fps=fps, caption=None)
                        probe = probe_clip(str(path), path.stat().st_size)
                        self.assertIsNone(probe.error)
                        self.assertEqual(probe.frames, decoded_frame_count(path))
                        self.assertEqual(Fraction(probe.fps), Fraction(fps))
                        self.assertEqual((probe.width, probe.height), (48, 32))
                        # Matroska and WebM keep no frame count: it comes from the duration
                        self.assertEqual(probe.counted_by, "duration"
                                         if suffix in (".mkv", ".webm") else "container")

    def test_the_display_rotation_swaps_width_and_height(self):
        for degrees, shown in ((0, (64, 48)), (90, (48, 64)), (180, (64, 48)), (270, (48, 64))):
            path = write_clip(self.tmp / f"rotated-{degrees}.mp4", 64, 48, 5, rotation=degrees,
                              caption=None)
            probe = probe_clip(str(path), path.stat().st_size)
            self.assertEqual((probe.width, probe.height), shown, degrees)


    def test_a_cut_file_is_truncated_whatever_its_header_says(self):
        for name, keep, options in (("cut.mkv", 0.9, {}), ("cut.webm", 0.6, {}),
                                    ("cut.avi", 0.9, {}), ("cut.mp4", 0.8, {"faststart": True})):
            path = write_clip(self.tmp / name, 64, 48, 30, caption=None, **options)
            whole = probe_clip(str(path), path.stat().st_size)
            self.assertIsNone(whole.error, name)
            path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])
            probe = probe_clip(str(path), path.stat().st_size)
            self.assertTrue(probe.error and probe.error.startswith(
                "truncated: the container says 30 frames, its data ends after about "), probe)
            present = int(probe.error.rsplit(" ", 1)[1])
            self.assertLess(present, 30)
            with self.subTest(name=name):  # what is there decodes, roughly as many frames
                try:
                    decoded = decoded_frame_count(path)
                except av.FFmpegError:  # the cut packet itself
                    decoded = None
                if decoded is not None:
                    self.assertLessEqual(abs(decoded - present), 2)

    def test_a_variable_frame_rate_is_counted_exactly_from_a_sample_table(self):
        for suffix in (".mp4", ".mov"):
            path = write_clip(self.tmp / f"vfr{suffix}", 64, 48, 40, fps=30, caption=None,
                              frame_ms=[20, 33, 33, 50, 70, 33])
            probe = probe_clip(str(path), path.stat().st_size)
            self.assertIsNone(probe.error, suffix)
            self.assertEqual((probe.frames, probe.counted_by), (40, "container"))
            self.assertEqual(probe.frames, decoded_frame_count(path))


class VideoDiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.data = cls.tmp / "clips"
        populate(cls.data)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def backend(self, output: str, **video) -> MetadataBackend:
        video = video or {"bucket_strategy": "resolution_frames", "min_frames": 5}
        return MetadataBackend.from_config(clip_dataset(self.data, **video),
                                           wan_training(self.tmp / output))

    def test_buckets_carry_the_frames_and_bad_files_are_skipped_with_their_reason(self):
        backend = self.backend("out-index")
        index = backend.refresh_index(show_progress=False)
        # 64x48 at 64x64's area, aligned to 16: 80x64; 23 frames snap down to 21 (4n+1)
        self.assertEqual(dict(index.buckets), {
            "64x64@37": ["nested/long.webm"], "64x80@9": ["phone.mp4"],
            "80x64@17": ["walk.mp4"], "80x64@21": ["wave.mkv"]})
        self.assertEqual({s.path: s.reason for s in index.skipped}, EXPECTED_SKIPS)
        self.assertEqual(index.clips["wave.mkv"], ClipPlan(21, "24/1", 23, "duration"))
        self.assertEqual(index.clips["phone.mp4"], ClipPlan(9, "30/1", 9, "container"))
        report = report_skipped_files({"clips": index}, self.tmp / "out-index")
        written = json.loads(report.read_text(encoding="utf-8"))["clips"]
        self.assertEqual({e["path"]: e["reason"] for e in written}, EXPECTED_SKIPS)
        other_rank = self.backend("out-index")
        self.assertEqual(other_rank.load_index().digest(), index.digest())
        self.assertEqual(other_rank.load_index().clips, index.clips)

    def test_num_frames_trains_every_clip_at_one_count_and_skips_shorter_ones(self):
        index = self.backend("out-fixed", num_frames=17).refresh_index(show_progress=False)
        self.assertEqual(dict(index.buckets), {"64x64@17": ["nested/long.webm"],
                                               "80x64@17": ["walk.mp4", "wave.mkv"]})
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertEqual(reasons["phone.mp4"], "too short: 9 frames, below num_frames 17")
        self.assertEqual({c.frames for c in index.clips.values()}, {17})

    def test_frame_interval_and_max_frames_as_simpletuner_defines_them(self):
        index = self.backend("out-interval", bucket_strategy="resolution_frames",
                             frame_interval=8, max_frames=30).refresh_index(show_progress=False)
        # 17 -> 16 -> 13, 23 -> 16 -> 13, 9 -> 8 -> 5, 3 -> 0: too short; 40 > max_frames
        self.assertEqual(dict(index.buckets), {"64x80@5": ["phone.mp4"],
                                               "80x64@13": ["walk.mp4", "wave.mkv"]})
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertEqual(reasons["nested/long.webm"], "too long: 40 frames, above max_frames 30")
        self.assertEqual(reasons["blink.mp4"], "too short: 3 frames train as 0 (frame_interval, "
                                               "then the 4n+1 frame rule), below min_frames 1")

    def test_a_warm_start_reads_no_clip_and_new_settings_rebucket_from_the_cache(self):
        backend = self.backend("out-warm")
        first = backend.refresh_index(show_progress=False)
        again = self.backend("out-warm")
        self.assertEqual(again.refresh_index(show_progress=False).digest(), first.digest())
        self.assertEqual((again.last_refresh.read, again.last_refresh.cache_written), (0, False))
        rebucketed = self.backend("out-warm", num_frames=9)
        index = rebucketed.refresh_index(show_progress=False)
        self.assertEqual(rebucketed.last_refresh.read, 0)
        self.assertNotEqual(index.digest(), first.digest())
        touch_later(self.data / "walk.mp4")
        changed = self.backend("out-warm")
        self.assertEqual(changed.refresh_index(show_progress=False).digest(), first.digest())
        self.assertEqual(changed.last_refresh.read, 1)

    def test_a_metadata_table_names_and_captions_the_clips(self):
        table = self.tmp / "clips.parquet"
        pyarrow.parquet.write_table(pyarrow.table({
            "filename": ["walk.mp4", "wave.mkv", "nested/long.webm", "phone.mp4", "gone.mp4"],
            "caption": ["a walk", "a wave", "a long one", None, "nothing"],
            "width": [64, 64, 48, 48, 1], "height": [48, 48, 48, 64, 1]}), table)
        dataset = DatasetConfig(
            id="clips", dataset_type="video", instance_data_dir=str(self.data),
            metadata_backend="parquet", caption_strategy="parquet",
            parquet={"path": str(table), "caption_column": "caption"},
            video={"bucket_strategy": "resolution_frames", "min_frames": 5})
        backend = MetadataBackend.from_config(dataset, wan_training(self.tmp / "out-table"))
        index = backend.refresh_index(show_progress=False)
        self.assertEqual(sorted(index.clips), ["nested/long.webm", "walk.mp4", "wave.mkv"])
        self.assertEqual(index.clips["wave.mkv"].frames, 21)  # from the clip, not the table
        self.assertEqual([backend.caption_for(s) for s in ("walk.mp4", "nested/long.webm")],
                         ["a walk", "a long one"])
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertIn("empty 'caption' (caption_strategy 'parquet')", reasons["phone.mp4"])
        self.assertIn("no such image in", reasons["gone.mp4"])
        self.assertEqual(reasons["blink.mp4"], f"no row in the metadata table {table}")
        self.assertEqual(reasons["cut.mp4"], EXPECTED_SKIPS["cut.mp4"])  # its probe's reason
        other_rank = MetadataBackend.from_config(dataset, wan_training(self.tmp / "out-table"))
        other_rank.load_index()
        self.assertEqual(other_rank.caption_for("wave.mkv"), "a wave")

    def test_filename_captions(self):
        dataset = DatasetConfig(id="clips", dataset_type="video", instance_data_dir=str(self.data),
                                caption_strategy="filename", video={"num_frames": 9})
        backend = MetadataBackend.from_config(dataset, wan_training(self.tmp / "out-names"))
        index = backend.refresh_index(show_progress=False)
        self.assertIn("uncaptioned.mp4", index.clips)
        self.assertEqual(backend.caption_for("nested/long.webm"), "long")


class S3VideoDiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.data = cls.tmp / "served" / BUCKET / PREFIX.rstrip("/")
        populate(cls.data)
        cls.server = RcloneS3Server(cls.tmp / "served", cls.tmp).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.server.__exit__()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def dataset(self, **overrides) -> DatasetConfig:
        return DatasetConfig(id="clips", dataset_type="video",
                             video={"bucket_strategy": "resolution_frames", "min_frames": 5},
                             **self.server.dataset(BUCKET, PREFIX, **overrides))

    def test_the_index_equals_local_discovery(self):
        remote = MetadataBackend.from_config(self.dataset(), wan_training(self.tmp / "out-s3"))
        index = remote.refresh_index(show_progress=False)
        local = MetadataBackend.from_config(clip_dataset(self.data, bucket_strategy=
                                                         "resolution_frames", min_frames=5),
                                            wan_training(self.tmp / "out-local"))
        expected = local.refresh_index(show_progress=False)
        self.assertEqual(index.buckets, expected.buckets)
        self.assertEqual(index.clips, expected.clips)
        self.assertEqual({s.path: s.reason for s in index.skipped}, EXPECTED_SKIPS)

    def test_a_remote_probe_reads_a_part_of_each_clip_and_no_byte_twice(self):
        folder = self.tmp / "served" / BUCKET / "big"
        sizes = {name: write_noisy_clip(folder / name, 96).stat().st_size
                 for name in ("noise.mp4", "noise.mkv")}
        backend = MetadataBackend.from_config(
            DatasetConfig(id="big", dataset_type="video", video={"num_frames": 81},
                          caption_strategy="filename", **self.server.dataset(BUCKET, "big/")),
            wan_training(self.tmp / "out-big"))
        ranges: dict[str, list[tuple[int, int]]] = {}
        backend.storage.client.meta.events.register(
            "provide-client-params.s3.GetObject", lambda params, **_: ranges.setdefault(
                params["Key"], []).append(tuple(map(int, params["Range"][6:].split("-")))))
        index = backend.refresh_index(show_progress=False)
        self.assertEqual(dict(index.buckets), {"80x64@81": ["noise.mkv", "noise.mp4"]})
        for name, size in sizes.items():
            fetched = sorted(ranges["big/" + name])
            self.assertTrue(all(a[1] < b[0] for a, b in zip(fetched, fetched[1:])), fetched)
            read = sum(end - start + 1 for start, end in fetched)
            # MP4: the header and the sample table; Matroska: also the last second's packets
            self.assertLess(read, size * (0.35 if name.endswith(".mp4") else 0.5), (name, size))

    def test_an_outage_while_probing_stops_with_a_storage_error(self):
        storage = open_storage(self.dataset(aws_retry_window_seconds=0.5))
        listing = storage.list_files()
        self.assertIn("walk.mp4", listing.sample_ids)
        self.server.kill()
        try:
            with self.assertRaises(StorageError) as caught:
                ClipSource(storage, "clips").read(listing, FileTable(), False)
        finally:
            self.server.start()
        self.assertIn("cannot reach", str(caught.exception))


class VideoAuditTest(unittest.TestCase):
    """Three ranks (gloo), accumulation 2: clips in two frame buckets of one size and one of
    another, a clip too short and a broken one, and an image dataset beside them."""

    WORLD = 3

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        clips = cls.tmp / "clips"
        for i in range(7):
            write_clip(clips / f"walk{i}.mp4", 64, 48, 17 + 6 * (i % 2), seed=i)
        for i in range(6):
            write_clip(clips / f"tall/{i}.mkv", 48, 64, 13, fps=24, seed=i)
        write_clip(clips / "blink.mp4", 64, 48, 2)
        write_truncated(clips / "cut.mp4")
        make_shapes(cls.tmp / "stills", per_size=6)
        datasets = [{"id": "clips", "dataset_type": "video", "instance_data_dir": str(clips),
                     "repeats": 1, "video": {"bucket_strategy": "resolution_frames",
                                                       "min_frames": 5}},
                    {"id": "stills", "instance_data_dir": str(cls.tmp / "stills")}]
        (cls.tmp / "multidatabackend.json").write_text(json.dumps(datasets))
        config = {"model_family": "wan", "pretrained_model_name_or_path": "builtin:tiny-wan",
                  "output_dir": str(cls.tmp / "out"), "resolution": 64,
                  "data_backend_config": str(cls.tmp / "multidatabackend.json"),
                  "aspect_bucket_alignment": 16, "train_batch_size": 1,
                  "gradient_accumulation_steps": 2, "seed": 11}
        (cls.tmp / "config.json").write_text(json.dumps(config))
        cls.private = cls.tmp / "tmp"  # the launched processes' TMPDIR
        cls.private.mkdir()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_clip_occurrence_once_and_every_step_one_bucket(self):
        output = self.tmp / "audit"
        results = launch(["--config", str(self.tmp / "config.json"), "--output", str(output),
                          "--epochs", "2"], self.WORLD, str(self.private))
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}")
        report = results[0][1]
        self.assertEqual(report.count(" 0 missing, 0 duplicated"), 2, report)
        plan = json.loads((output / "plan.json").read_text())
        self.assertEqual(sorted(plan["datasets"]["clips"]["buckets"]),
                         ["64x80@13", "80x64@17", "80x64@21"])
        traces = [[json.loads(line) for line in
                   (output / f"rank-{r}.jsonl").read_text(encoding="utf-8").splitlines()]
                  for r in range(self.WORLD)]
        self.assertEqual(len({len(t) for t in traces}), 1)
        for at in range(0, len(traces[0]), 2):  # one optimizer step: 2 micro-batches x 3 ranks
            step = [m for t in traces for m in t[at:at + 2]]
            self.assertEqual(len({(m["dataset"], m["bucket"]) for m in step}), 1, step)
        trained = {s for t in traces for m in t if m["dataset"] == "clips" for s in m["samples"]}
        self.assertEqual(trained, {f"walk{i}.mp4" for i in range(7)}
                         | {f"tall/{i}.mkv" for i in range(6)})

    def test_plan_shows_the_frame_buckets_and_the_skips(self):
        result = run_bounded([sys.executable, "-m", "simpletuner", "plan", "--config",
                              str(self.tmp / "config.json")], tmpdir=self.private,
                             timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        table = result.stdout.split("dataset 'clips'", 1)[1].split("dataset 'stills'", 1)[0]
        rows = {line.split()[0]: line.split()[1] for line in table.splitlines()
                if "@" in line}
        self.assertEqual(rows, {"80x64@17": "4", "80x64@21": "3", "64x80@13": "6"})
        self.assertIn("bucket    clips", table)
        self.assertIn("1  too short: 2 frames, below min_frames 5", table)
        self.assertIn("1  cannot be decoded (truncated, corrupt or not a video)", table)
        self.assertIn("dataset 'clips': 15 clip files, ", result.stderr)
        self.assertIn("13 clips in 3 buckets, 2 skipped", result.stderr)
        result = run_bounded([sys.executable, "-m", "simpletuner", "plan", "--json", "--config",
                              str(self.tmp / "config.json")], tmpdir=self.private,
                             timeout=120)
        clips = json.loads(result.stdout)["datasets"]["clips"]["clips"]
        self.assertEqual(clips["walk1.mp4"], {"frames": 21, "fps": "16/1", "source_frames": 23,
                                              "counted_by": "container"})
        self.assertEqual(clips["tall/0.mkv"], {"frames": 13, "fps": "24/1", "source_frames": 13,
                                               "counted_by": "duration"})


if __name__ == "__main__":
    unittest.main()
