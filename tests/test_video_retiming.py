"""Re-timing clips to ``video.fps``: the re-timed frame count against a brute-force count of
the instants before a clip's end, the decoder's frames against the source frames each instant
shows (8, 24, 30, 29.97 fps and a Matroska clip's rounded millisecond timestamps), discovery's
buckets and skip reasons over clips at 8, 16, 24 and 30 fps, the log line naming the re-timed
clips, the latent cache decoding the re-timed frames, exactly-once and lockstep over a grid of
re-timed clips and in a two-rank audit. Without ``fps`` nothing changes: frames as decoded."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import random
import shutil
import tempfile
import unittest
from collections import Counter
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from simpletuner.configuration import DatasetConfig
from simpletuner.configuration.video_block import VideoSettings
from simpletuner.helpers.caching.latents import LatentSettings, cache_latents
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.buckets import bucket_for
from simpletuner.helpers.metadata.clip_timing import retimed_frames
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex
from simpletuner.helpers.metadata.video_buckets import bucket_frames, with_frames
from simpletuner.helpers.multiaspect.clip import ShortClipError, decode_frames
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.planning import run_plan
from test_distributed import launch
from test_video_buckets import RULES, SETTING_GRID, SIZES, oracle_frames, settings
from video_fixtures import write_clip
from discovery_fixtures import training_config


def instants_before_end(frames: int, rate: Fraction, target: int) -> int:
    """By enumeration: the instants k/target (k = 0, 1, ...) before the clip's end frames/rate."""
    k = 0
    while Fraction(k, target) < frames / rate:
        k += 1
    return k


def shown_at(k: int, rate: Fraction, target: int) -> int:
    """The source frame on screen at k/target: the last i with i/rate <= k/target."""
    i = 0
    while Fraction(i + 1) / rate <= Fraction(k, target):
        i += 1
    return i


def decoded(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


class RetimedCountTest(unittest.TestCase):
    def test_counts_equal_the_instants_before_the_end(self):
        # by hand: 2 s at 24 fps are 32 frames at 16; 9 frames at 8 fps (1.125 s) are 18
        self.assertEqual(retimed_frames(48, "24/1", 16), 32)
        self.assertEqual(retimed_frames(9, "8/1", 16), 18)
        self.assertEqual(retimed_frames(31, "30/1", 16), 17)
        self.assertEqual(retimed_frames(17, "16/1", 16), 17)
        for rate, count in itertools.product(("8/1", "24/1", "30/1", "30000/1001", "25/2"),
                                             range(1, 70)):
            with self.subTest(rate=rate, count=count):
                self.assertEqual(retimed_frames(count, rate, 16),
                                 instants_before_end(count, Fraction(rate), 16))


class RetimedDecodeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def check(self, name: str, frames: int, fps, target: int = 16):
        path = write_clip(self.tmp / name, 32, 32, frames, fps=fps)
        source = decoded(path)
        expected = instants_before_end(frames, Fraction(fps), target)
        pictures = decode_frames(path.read_bytes(), expected, fps=target)
        picked = [shown_at(k, Fraction(fps), target) for k in range(expected)]
        for k, (picture, index) in enumerate(zip(pictures, picked)):
            with self.subTest(name=name, frame=k):
                np.testing.assert_array_equal(np.asarray(picture), source[index])
        with self.assertRaises(ShortClipError) as caught:
            decode_frames(path, expected + 1, fps=target)
        self.assertIn(f"decoded {expected} frames re-timed to {target} fps", str(caught.exception))
        return picked

    def test_a_faster_clip_loses_frames_and_a_slower_one_repeats_them(self):
        self.assertEqual(self.check("fast.mp4", 12, 24), [0, 1, 3, 4, 6, 7, 9, 10])
        self.assertEqual(self.check("slow.mp4", 4, 8), [0, 0, 1, 1, 2, 2, 3, 3])
        self.assertEqual(self.check("ntsc.mp4", 20, Fraction(30000, 1001))[:4], [0, 1, 3, 5])
        self.assertEqual(self.check("same.mp4", 9, 16), list(range(9)))

    def test_rounded_millisecond_timestamps_pick_the_frames_the_count_assumed(self):
        # Matroska keeps milliseconds: 30 fps frames at 0, 33, 67, 100 ms ...; 15 fps asks for
        # 0, 66.7, 133.3 ms, where frame 2 (67 ms) must still be the one picked
        self.assertEqual(self.check("rounded.mkv", 21, 30, target=15), list(range(0, 21, 2)))

    def test_without_fps_the_first_frames_as_decoded(self):
        path = write_clip(self.tmp / "plain.mp4", 32, 32, 10, fps=30)
        source = decoded(path)
        for picture, frame in zip(decode_frames(path, 10), source):
            np.testing.assert_array_equal(np.asarray(picture), frame)


def populate(folder: Path) -> None:
    write_clip(folder / "eight.mp4", 64, 48, 5, fps=8)       # 10 at 16 fps -> 9
    write_clip(folder / "sixteen.mp4", 64, 48, 17, fps=16)   # unchanged
    write_clip(folder / "cinema.mkv", 64, 48, 36, fps=24)    # 24 -> 21
    write_clip(folder / "phone.mp4", 64, 48, 20, fps=30)     # 11 -> 9
    write_clip(folder / "blink.mp4", 64, 48, 7, fps=30)      # 4: too short at 16 fps


class RetimedDiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp())
        cls.data = cls.tmp / "clips"
        populate(cls.data)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def index(self, output: str, **video) -> DatasetIndex:
        dataset = DatasetConfig(id="clips", dataset_type="video", instance_data_dir=str(self.data),
                                video={"bucket_strategy": "resolution_frames", "min_frames": 5,
                                       **video})
        training = training_config(self.tmp / output, model_family="wan",
                                   pretrained_model_name_or_path="builtin:tiny-wan")
        return MetadataBackend.from_config(dataset, training).refresh_index(show_progress=False)

    def test_buckets_count_the_retimed_frames_and_skips_say_so(self):
        index = self.index("out-16", fps=16)
        self.assertEqual(dict(index.buckets), {"80x64@9": ["eight.mp4", "phone.mp4"],
                                               "80x64@17": ["sixteen.mp4"],
                                               "80x64@21": ["cinema.mkv"]})
        self.assertEqual({s.path: s.reason for s in index.skipped}, {
            "blink.mp4": "too short: 7 frames at 30 fps, 4 at 16 fps, below min_frames 5"})
        self.assertEqual(index.clips["phone.mp4"], ClipPlan(9, "30/1", 20, "container", 16))
        self.assertEqual(index.clips["cinema.mkv"], ClipPlan(21, "24/1", 36, "duration", 16))
        self.assertEqual(index.clips["sixteen.mp4"], ClipPlan(17, "16/1", 17, "container"))

    def test_num_frames_skips_a_clip_too_short_once_retimed(self):
        index = self.index("out-fixed", fps=16, num_frames=17, min_frames=None,
                           bucket_strategy="aspect_ratio")
        self.assertEqual(dict(index.buckets), {"80x64@17": ["cinema.mkv", "sixteen.mp4"]})
        reasons = {s.path: s.reason for s in index.skipped}
        self.assertEqual(reasons["phone.mp4"],
                         "too short: 20 frames at 30 fps, 11 at 16 fps, below num_frames 17")

    def test_without_fps_frames_train_as_decoded_and_the_digest_is_unchanged(self):
        index = self.index("out-plain")
        self.assertEqual(dict(index.buckets), {"80x64@5": ["blink.mp4", "eight.mp4"],
                                               "80x64@17": ["phone.mp4", "sixteen.mp4"],
                                               "80x64@33": ["cinema.mkv"]})
        self.assertTrue(all(plan.retimed_fps is None for plan in index.clips.values()))
        self.assertNotIn("fps", VideoSettings.for_dataset({}, "wan").key())
        # the index content as it was digested before re-timing existed: fps and source frames
        unretimed = DatasetIndex("clips", index.buckets, {}, clips={
            s: ClipPlan(p.frames, p.fps, p.source_frames, p.counted_by)
            for s, p in index.clips.items()})
        self.assertEqual(unretimed.digest(), index.digest())
        self.assertNotEqual(self.index("out-16b", fps=16).digest(), index.digest())

    def test_plan_logs_which_clips_were_retimed_from_which_rate(self):
        (self.tmp / "multidatabackend.json").write_text(json.dumps([{
            "id": "clips", "dataset_type": "video", "instance_data_dir": str(self.data),
            "video": {"bucket_strategy": "resolution_frames", "min_frames": 5, "fps": 16}}]))
        (self.tmp / "config.json").write_text(json.dumps({
            "model_family": "wan", "pretrained_model_name_or_path": "builtin:tiny-wan",
            "output_dir": str(self.tmp / "out-plan"), "resolution": 64,
            "aspect_bucket_alignment": 16,
            "data_backend_config": str(self.tmp / "multidatabackend.json")}))
        stdout = io.StringIO()
        with self.assertLogs("simpletuner.plan", "INFO") as logs, \
                contextlib.redirect_stdout(stdout):
            self.assertEqual(run_plan(str(self.tmp / "config.json"), as_json=True), 0)
        self.assertIn("dataset 'clips': 3 clips re-timed to 16 fps (video.fps): 1 from 8 fps "
                      "(eight.mp4); 1 from 24 fps (cinema.mkv); 1 from 30 fps (phone.mp4)",
                      [record.getMessage() for record in logs.records])
        clips = json.loads(stdout.getvalue())["datasets"]["clips"]["clips"]
        self.assertEqual(clips["phone.mp4"], {"frames": 9, "fps": "30/1", "source_frames": 20,
                                              "counted_by": "container", "retimed_fps": 16})
        self.assertNotIn("retimed_fps", clips["sixteen.mp4"])


class RetimedLatentsTest(unittest.TestCase):
    """The cache encodes the re-timed frames (an identity 'VAE' keeps the pixels to compare)."""

    def test_the_cached_frames_are_the_retimed_ones_and_the_key_names_the_rate(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            path = write_clip(root / "clips" / "fast.mp4", 32, 32, 12, fps=24)
            plan = ClipPlan(5, "24/1", 12, "container", 16)
            index = DatasetIndex("clips", {"32x32@5": ["fast.mp4"]}, {"fast.mp4": (32, 32)},
                                 clips={"fast.mp4": plan})
            settings_ = LatentSettings("clips", LocalStorage(root / "clips"), root / "vae",
                                       "identity", crop=False, crop_style="center", seed=0)
            result = cache_latents(index, settings_, lambda pixels: pixels, progress=False)
            self.assertEqual(result.failures, {})
            cached = result.cache.load(["fast.mp4"]).latents[0]  # [3, F, H, W] in [-1, 1]
            source = decoded(path)
            for k, index_ in enumerate([0, 1, 3, 4, 6]):
                as_rgb = ((cached[:, k].permute(1, 2, 0) + 1) * 127.5).round().numpy()
                np.testing.assert_allclose(as_rgb, source[index_], atol=1)
            untimed = DatasetIndex("clips", index.buckets, index.original_sizes,
                                   clips={"fast.mp4": ClipPlan(5, "24/1", 12, "container")})
            again = cache_latents(untimed, settings_, lambda pixels: pixels, progress=False)
            self.assertNotEqual(again.cache.paths["fast.mp4"], result.cache.paths["fast.mp4"])


class RetimedAuditTest(unittest.TestCase):
    """Two gloo ranks through the exactly-once audit on clips re-timed to 16 fps; start-up logs
    which clips it re-timed."""

    def test_every_retimed_clip_once_in_its_retimed_bucket(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for i in range(4):  # 34 frames at 24 fps and 40 at 30 are 23 and 22 at 16: @21
                write_clip(root / "clips" / f"cinema{i}.mkv", 64, 48, 34, fps=24, seed=i)
                write_clip(root / "clips" / f"phone{i}.mp4", 64, 48, 40, fps=30, seed=i)
            (root / "multidatabackend.json").write_text(json.dumps([{
                "id": "clips", "dataset_type": "video", "instance_data_dir": str(root / "clips"),
                "video": {"bucket_strategy": "resolution_frames", "fps": 16}}]))
            (root / "config.json").write_text(json.dumps({
                "model_family": "wan", "pretrained_model_name_or_path": "builtin:tiny-wan",
                "output_dir": str(root / "out"), "resolution": 64, "aspect_bucket_alignment": 16,
                "data_backend_config": str(root / "multidatabackend.json"),
                "train_batch_size": 1, "seed": 4}))
            (root / "tmp").mkdir()
            results = launch(["--config", str(root / "config.json"), "--output",
                              str(root / "audit"), "--epochs", "2"], 2, str(root / "tmp"))
            for rank, (code, out, err) in enumerate(results):
                self.assertEqual(code, 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}")
            self.assertEqual(results[0][1].count(" 0 missing, 0 duplicated"), 2, results[0][1])
            self.assertIn("dataset 'clips': 8 clips re-timed to 16 fps (video.fps): 4 from 24 "
                          "fps (cinema0.mkv, cinema1.mkv, cinema2.mkv and 1 more); 4 from 30 fps "
                          "(phone0.mp4, phone1.mp4, phone2.mp4 and 1 more)", results[0][2])
            plan = json.loads((root / "audit" / "plan.json").read_text())
            self.assertEqual(list(plan["datasets"]["clips"]["buckets"]), ["80x64@21"])


RATES = ("8/1", "16/1", "24/1", "30/1", "30000/1001")
LENGTHS = (3, 9, 17, 23, 40, 61)
REPEATS = 2


class RetimedGridTest(unittest.TestCase):
    """Clips of random lengths, sizes and rates bucketed re-timed to 16 fps, over frame rules,
    settings, batch sizes, world sizes, accumulation and bucket tails: every rank simulated."""

    def test_exactly_once_and_lockstep_on_the_retimed_buckets(self):
        rng = random.Random(16)
        grid = itertools.product(RULES[:2], SETTING_GRID[:1] + SETTING_GRID[3:6], (1, 2),
                                 (1, 3), (1, 2), ("trim", "carry"))
        for rule, options, batch, world, accumulation, tail in grid:
            video = VideoSettings(**{**vars(settings(rule, **options)), "fps": 16})
            with self.subTest(rule=rule, options=options, batch=batch, world=world,
                              accumulation=accumulation, tail=tail):
                index = self.clip_index(rng, video, batch * world * accumulation)
                self.assertTrue(index.buckets)
                self.check(SamplerDataset(index, str, batch, REPEATS, bucket_tail=tail),
                           world, accumulation, tail)

    def clip_index(self, rng: random.Random, video: VideoSettings, effective: int) -> DatasetIndex:
        clips = {f"c/{i:03d}.mp4": (rng.choice((64, 96)), rng.choice(LENGTHS), rng.choice(RATES))
                 for i in range(60)}
        names = list(clips)
        keys = with_frames([bucket_for(w, 64, SIZES) for w, _, _ in clips.values()], names,
                           [n for _, n, _ in clips.values()], video, [],
                           [r for *_, r in clips.values()])
        buckets: dict[str, list[str]] = {}
        for name, key in zip(names, keys):
            _, count, rate = clips[name]
            expected = oracle_frames(instants_before_end(count, Fraction(rate), 16), video)
            self.assertEqual(0 if key is None else bucket_frames(key), expected, (name, key))
            if key is not None:
                buckets.setdefault(key, []).append(name)
        return DatasetIndex("clips", {k: ids for k, ids in buckets.items()
                                      if len(ids) * (REPEATS + 1) >= effective}, {})

    def check(self, dataset: SamplerDataset, world: int, accumulation: int, tail: str):
        samplers = [MultiAspectSampler([dataset], seed=3, processes=world, rank=rank,
                                       accumulation=accumulation) for rank in range(world)]
        one_pass = Counter({s: REPEATS + 1 for ids in dataset.index.buckets.values() for s in ids})
        trained: Counter = Counter()
        left_out: Counter = Counter()
        for epoch in range(2):
            runs = [[s.plan(epoch, step) for step in range(s.micro_batches_in(epoch))]
                    for s in samplers]
            self.assertEqual(len({len(run) for run in runs}), 1)
            for start in range(0, len(runs[0]), accumulation):
                step = [m for run in runs for m in run[start:start + accumulation]]
                self.assertEqual(len({m.bucket for m in step}), 1)
            trained.update(x.sample_id for run in runs for m in run for x in m.samples)
            slices = samplers[0].slices(epoch)
            if tail == "trim":
                left_out.update(x for p in slices for x in p.trimmed)
                left = left_out
            else:
                left = Counter(x for p in slices for x in p.carried)
            self.assertEqual(trained + left,
                             Counter({k: v * (epoch + 1) for k, v in one_pass.items()}))


if __name__ == "__main__":
    unittest.main()
