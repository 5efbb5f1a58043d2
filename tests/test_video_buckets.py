"""Video datasets without a clip on disk: the video block's checks, the family frame rules, the
frame count each clip trains at, and exactly-once and lockstep on (resolution, frames) buckets
over grids of clip lengths, fps, frame rules, batch sizes and world sizes."""

from __future__ import annotations

import itertools
import json
import random
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.configuration.video_block import VideoSettings
from simpletuner.families import family_spec
from simpletuner.families.frame_rule import FrameRule
from simpletuner.helpers.metadata.buckets import BucketSettings, bucket_for, parse_bucket_key
from simpletuner.helpers.metadata.index import ClipPlan, DatasetIndex
from simpletuner.helpers.metadata.video_buckets import bucket_frames, training_frames, with_frames
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

SIZES = BucketSettings(resolution=64, resolution_type="pixel", alignment=16, square=False)
# main's DatasetIndex.digest of this image index, before clips existed: it must not change
IMAGE_INDEX = {"64x64": ["a.png", "b.png"], "96x64": ["c.png"]}
IMAGE_DIGEST = "7c8648b8de97c439c1a54a30bf563c4e16a5fd6c34d9b3802f041e6d4d0ba729"


class VideoConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "clips").mkdir()

    def load(self, family: str, *datasets: dict):
        config = {"model_family": family, "pretrained_model_name_or_path": f"builtin:tiny-{family}",
                  "output_dir": "out", "data_backend_config": "multidatabackend.json"}
        (self.root / "config.json").write_text(json.dumps(config))
        (self.root / "multidatabackend.json").write_text(json.dumps(list(datasets)))
        return load_configuration(self.root / "config.json", cwd=self.root)

    def problems(self, family: str, *datasets: dict) -> list[str]:
        with self.assertRaises(ConfigError) as caught:
            self.load(family, *datasets)
        return caught.exception.problems

    def clips(self, **overrides) -> dict:
        return {"id": "clips", "dataset_type": "video", "instance_data_dir": "clips", **overrides}

    def test_simpletuner_video_block_is_read_with_its_defaults(self):
        config = self.load("wan", self.clips(video={"num_frames": 33, "is_i2v": False}),
                           {"id": "stills", "instance_data_dir": "clips"})
        clips, stills = config.datasets
        video = clips.video_settings("wan")
        self.assertEqual((video.num_frames, video.min_frames, video.max_frames),
                         (33, 33, None))
        self.assertEqual((video.bucket_strategy, video.rule), ("aspect_ratio", FrameRule(4, 1)))
        self.assertEqual((stills.dataset_type, stills.video), ("image", None))
        config = self.load("wan", self.clips(video={
            "bucket_strategy": "resolution_frames", "frame_interval": 8, "min_frames": 5,
            "max_frames": 200}))
        video = config.datasets[0].video_settings("wan")
        self.assertEqual((video.num_frames, video.min_frames, video.max_frames,
                          video.frame_interval), (None, 5, 200, 8))

    def test_impossible_combinations_are_all_reported_before_any_work(self):
        problems = self.problems("wan", self.clips(video={
            "num_frames": 81, "min_frames": 90, "max_frames": 49, "frame_interval": 4}))
        self.assertEqual(len(problems), 3, problems)
        self.assertIn("'min_frames' (90) is larger than 'max_frames' (49)", problems[0])
        self.assertIn("'num_frames' (81) is larger than 'max_frames' (49)", problems[1])
        self.assertIn("'frame_interval' rounds the frame counts of bucket_strategy "
                      "'resolution_frames' without 'num_frames'", problems[2])
        problems = self.problems("wan", self.clips())
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("bucket_strategy 'aspect_ratio' trains every clip at one frame count; set "
                      "'num_frames'", problems[0])

    def test_wrong_keys_and_values_name_the_block_and_the_key(self):
        problems = self.problems("wan", self.clips(video={
            "num_frames": 0, "bucket_strategy": "duration", "frame_rate": 16}))
        self.assertEqual(len(problems), 3, problems)
        text = "\n".join(problems)
        self.assertIn("key 'video': key 'num_frames' is 0; expected a value >= 1", text)
        self.assertIn("key 'bucket_strategy' is 'duration'; expected one of 'aspect_ratio', "
                      "'resolution_frames'", text)
        self.assertIn("key 'video': unknown key 'frame_rate'", text)
        problems = self.problems("wan", self.clips(video=[81]))
        self.assertTrue(any("key 'video'" in p for p in problems), problems)

    def test_a_video_dataset_needs_a_family_that_trains_on_clips(self):
        problems = self.problems("flux", self.clips(video={"num_frames": 17}))
        self.assertEqual(len(problems), 1, problems)
        self.assertRegex(problems[0], r"'dataset_type': 'video' needs a model family that trains "
                                      r"on clips \([^)]*\bwan\b[^)]*\); model_family 'flux' "
                                      r"trains on images")

    def test_num_frames_must_be_a_count_the_family_vae_encodes(self):
        problems = self.problems("wan", self.clips(video={"num_frames": 80}))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("'num_frames' (80) is not a count wan's VAE encodes (4n+1 frames); use 77 "
                      "or 81", problems[0])
        problems = self.problems("wan", self.clips(video={"num_frames": 80, "max_frames": 50}))
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("'num_frames' (80) is not a count wan's VAE encodes", problems[1])

    def test_clips_are_listed_and_probed_even_with_a_table(self):
        problems = self.problems("wan", self.clips(
            video={"num_frames": 17}, metadata_backend="parquet", caption_strategy="parquet",
            parquet={"path": "clips.parquet", "caption_column": "caption", "trust_table": True}))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("parquet.trust_table skips listing the storage, but every clip is probed "
                      "for its frames; set trust_table false", problems[0])

    def test_a_video_block_on_an_image_dataset_is_refused(self):
        problems = self.problems("wan", {"id": "stills", "instance_data_dir": "clips",
                                         "video": {"num_frames": 17}})
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("key 'video' is read for 'dataset_type': 'video' only; this dataset is "
                      "'image'", problems[0])


class FrameRuleTest(unittest.TestCase):
    def test_snap_down_is_the_largest_accepted_count_not_above(self):
        wan = family_spec("wan").frame_rule
        for rule in (wan, FrameRule(8, 1), FrameRule(1, 0), FrameRule(4, 0)):
            for frames in range(0, 130):
                snapped = rule.snap_down(frames)
                accepted = [n for n in range(0, frames + 1) if rule.accepts(n)]
                self.assertEqual(snapped, max(accepted, default=0), (rule, frames))
        self.assertEqual([n for n in range(1, 30) if wan.accepts(n)],
                         [1, 5, 9, 13, 17, 21, 25, 29])


def settings(rule: FrameRule, num_frames=None, min_frames=None, max_frames=None,
             frame_interval=None) -> VideoSettings:
    floor = min_frames or num_frames or 1
    return VideoSettings(rule, num_frames, max(floor, num_frames or 1), max_frames,
                         frame_interval, False, "resolution_frames" if num_frames is None
                         else "aspect_ratio")


def oracle_frames(count: int, video: VideoSettings) -> int:
    """By brute force: the largest count the rule accepts within what the settings allow of
    the clip; 0 when it is skipped."""
    if count < video.min_frames or (video.max_frames and count > video.max_frames):
        return 0
    if video.num_frames is not None:
        limit = video.num_frames if count >= video.num_frames else 0
    else:
        limit = count - count % (video.frame_interval or 1)
    found = max((f for f in range(1, limit + 1) if video.rule.accepts(f)), default=0)
    return found if found >= (1 if video.num_frames is not None else video.min_frames) else 0


SETTING_GRID = [dict(), dict(min_frames=9), dict(max_frames=60), dict(frame_interval=8),
                dict(frame_interval=5, min_frames=12, max_frames=90), dict(num_frames=17),
                dict(num_frames=33, max_frames=100)]
RULES = [FrameRule(4, 1), FrameRule(8, 1), FrameRule(1, 0), FrameRule(4, 0)]


class TrainingFramesTest(unittest.TestCase):
    def test_every_clip_length_against_a_brute_force_oracle(self):
        for rule, options in itertools.product(RULES, SETTING_GRID):
            if options.get("num_frames") and not rule.accepts(options["num_frames"]):
                continue  # the loader refuses such a num_frames
            video = settings(rule, **options)
            for count in range(1, 130):
                frames, reason = training_frames(count, video)
                with self.subTest(rule=rule, options=options, count=count):
                    self.assertEqual(frames, oracle_frames(count, video))
                    self.assertEqual(reason is None, frames > 0)
                    if frames:
                        self.assertTrue(rule.accepts(frames) and frames <= count)
                    else:
                        self.assertTrue(reason.startswith(("too short", "too long")), reason)

    def test_keys_keep_image_buckets_and_their_digest(self):
        self.assertEqual(DatasetIndex("stills", IMAGE_INDEX, {}).digest(), IMAGE_DIGEST)
        self.assertEqual((parse_bucket_key("96x64@17"), bucket_frames("96x64@17")),
                         ((96, 64), 17))
        self.assertEqual((parse_bucket_key("96x64"), bucket_frames("96x64")), ((96, 64), 1))
        for bad in ("96x64@", "96x64@0", "96x64@x"):
            with self.assertRaises(ValueError):
                bucket_frames(bad)

    def test_the_agreement_digest_covers_frames_and_source_fps(self):
        def index(key: str, fps: str) -> DatasetIndex:
            return DatasetIndex("clips", {key: ["a.mp4"]}, {},
                                clips={"a.mp4": ClipPlan(bucket_frames(key), fps, 30, "container")})

        digests = {index(key, fps).digest() for key in ("64x64@17", "64x64@21")
                   for fps in ("16/1", "30000/1001")}
        self.assertEqual(len(digests), 4)
        self.assertNotIn(IMAGE_DIGEST, digests)

    def test_a_clip_dropped_from_the_index_takes_its_plan_along(self):
        plan = ClipPlan(17, "24/1", 20, "duration")
        index = DatasetIndex("clips", {"64x64@17": ["a.mp4", "b.mp4"]}, {},
                             clips={"a.mp4": plan, "b.mp4": plan})
        kept = index.without({"a.mp4": "decoded 12 frames, its bucket needs 17"})
        self.assertEqual((dict(kept.buckets), dict(kept.clips)),
                         ({"64x64@17": ["b.mp4"]}, {"b.mp4": plan}))
        self.assertEqual([(s.path, s.reason) for s in kept.skipped],
                         [("a.mp4", "decoded 12 frames, its bucket needs 17")])


LENGTHS = (3, 9, 17, 23, 40, 61, 88)  # frames: some too short, most snapping down
REPEATS = 3


def clip_index(rng: random.Random, count: int, video: VideoSettings,
               effective: int) -> tuple[DatasetIndex, dict[str, tuple[int, int, int]]]:
    """A video dataset's index over random clips, bucketed as discovery does (size bucket, then
    with_frames), and each clip's (width, height, frames). Buckets the split would refuse as
    smaller than the effective batch are left out (test_split covers the refusal)."""
    clips = {f"clips/{i:03d}.mp4": (rng.choice((64, 96)), 64, rng.choice(LENGTHS))
             for i in range(count)}
    names = list(clips)
    keys = with_frames([bucket_for(w, h, SIZES) for w, h, _ in clips.values()], names,
                       [n for *_, n in clips.values()], video, [])
    buckets: dict[str, list[str]] = {}
    for name, key in zip(names, keys):
        if key is not None:
            buckets.setdefault(key, []).append(name)
    buckets = {k: ids for k, ids in buckets.items() if len(ids) * (REPEATS + 1) >= effective}
    return DatasetIndex("clips", buckets, {}), clips


class VideoBucketGridTest(unittest.TestCase):
    """Clips of random lengths and sizes, with images mixed in, over frame rules, settings,
    batch sizes, world sizes, accumulation and bucket tails: every rank's sampler simulated."""

    def test_exactly_once_and_lockstep_on_resolution_and_frames(self):
        rng = random.Random(24)
        grid = itertools.product(RULES[:2], SETTING_GRID[:2] + SETTING_GRID[3:6], (1, 2),
                                 (1, 2, 3), (1, 2), ("trim", "carry"))
        for rule, options, batch, world, accumulation, tail in grid:
            video = settings(rule, **options)
            clips, shapes = clip_index(rng, 80, video, batch * world * accumulation)
            stills = DatasetIndex("stills", {"64x64": [f"s/{i}.png" for i in range(14)],
                                             "96x64": [f"w/{i}.png" for i in range(9)]}, {})
            datasets = [SamplerDataset(clips, str, batch, REPEATS, bucket_tail=tail),
                        SamplerDataset(stills, str, batch, REPEATS, bucket_tail=tail)]
            with self.subTest(rule=rule, options=options, batch=batch, world=world,
                              accumulation=accumulation, tail=tail):
                self.assertTrue(clips.buckets)
                self.check(datasets, shapes, video, world, accumulation, tail)

    def check(self, datasets, shapes, video, world, accumulation, tail):
        samplers = [MultiAspectSampler(datasets, seed=5, processes=world, rank=rank,
                                       accumulation=accumulation) for rank in range(world)]
        one_pass = Counter({(d.index.dataset_id, s): REPEATS + 1 for d in datasets
                            for ids in d.index.buckets.values() for s in ids})
        trained: Counter = Counter()
        for epoch in range(2):  # the second trains what the first carried
            runs = [[s.plan(epoch, step) for step in range(s.micro_batches_in(epoch))]
                    for s in samplers]
            self.assertEqual(len({len(run) for run in runs}), 1)
            for start in range(0, len(runs[0]), accumulation):  # one optimizer step
                step = [m for run in runs for m in run[start:start + accumulation]]
                self.assertEqual(len({(m.dataset_id, m.bucket) for m in step}), 1)
                trains_at = {self.shape(m.dataset_id, x.sample_id, m.bucket, shapes, video)
                             for m in step for x in m.samples}
                self.assertEqual(len(trains_at), 1, trains_at)
            trained.update((m.dataset_id, x.sample_id) for run in runs for m in run
                           for x in m.samples)
            left = Counter((p.dataset_id, x) for p in samplers[0].slices(epoch)
                           for x in (p.carried if tail == "carry" else p.trimmed))
            if tail == "trim":  # each epoch: its pass, less what it trims
                self.assertEqual(trained + self.trimmed_so_far(samplers, epoch),
                                 Counter({k: v * (epoch + 1) for k, v in one_pass.items()}))
            else:  # after epoch e: e+1 whole passes, less what waits for the next epoch
                self.assertEqual(trained + left,
                                 Counter({k: v * (epoch + 1) for k, v in one_pass.items()}))

    @staticmethod
    def trimmed_so_far(samplers, epoch: int) -> Counter:
        return Counter((p.dataset_id, x) for e in range(epoch + 1)
                       for p in samplers[0].slices(e) for x in p.trimmed)

    def shape(self, dataset_id, sample_id, bucket, shapes, video) -> tuple[int, int, int]:
        """(W, H, F) the sample trains at; a clip's checked against its size and the oracle."""
        width, height = parse_bucket_key(bucket)
        if dataset_id == "clips":
            w, h, count = shapes[sample_id]
            self.assertEqual(bucket_frames(bucket), oracle_frames(count, video))
            self.assertEqual((width, height), parse_bucket_key(bucket_for(w, h, SIZES)))
        return width, height, bucket_frames(bucket)


if __name__ == "__main__":
    unittest.main()
