"""Video datasets without a clip on disk: the video block's checks, the family frame rules, the
frame count each clip trains at, and exactly-once and lockstep on (resolution, frames) buckets
over grids of clip lengths, fps, frame rules, batch sizes and world sizes."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.configuration.video_frames import FRAME_RULES, FrameRule


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
            "num_frames": 0, "bucket_strategy": "duration", "fps": 16}))
        self.assertEqual(len(problems), 3, problems)
        text = "\n".join(problems)
        self.assertIn("key 'video': key 'num_frames' is 0; expected a value >= 1", text)
        self.assertIn("key 'bucket_strategy' is 'duration'; expected one of 'aspect_ratio', "
                      "'resolution_frames'", text)
        self.assertIn("key 'video': unknown key 'fps'", text)
        problems = self.problems("wan", self.clips(video=[81]))
        self.assertTrue(any("key 'video'" in p for p in problems), problems)

    def test_a_video_dataset_needs_a_family_that_trains_on_clips(self):
        problems = self.problems("flux", self.clips(video={"num_frames": 17}))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("'dataset_type': 'video' needs a model family that trains on clips (wan); "
                      "model_family 'flux' trains on images", problems[0])

    def test_num_frames_must_be_a_count_the_family_vae_encodes(self):
        problems = self.problems("wan", self.clips(video={"num_frames": 80}))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("'num_frames' (80) is not a count wan's VAE encodes (4n+1 frames); use 77 "
                      "or 81", problems[0])

    def test_clips_are_probed_not_read_from_a_table(self):
        table = self.root / "clips.parquet"
        problems = self.problems("wan", self.clips(
            video={"num_frames": 17}, metadata_backend="parquet", caption_strategy="parquet",
            parquet={"path": str(table), "caption_column": "caption"}))
        self.assertTrue(any("'dataset_type': 'video' probes each clip (metadata_backend "
                            "'discovery'); metadata_backend 'parquet' is not read" in p
                            for p in problems), problems)

    def test_a_video_block_on_an_image_dataset_is_refused(self):
        problems = self.problems("wan", {"id": "stills", "instance_data_dir": "clips",
                                         "video": {"num_frames": 17}})
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("key 'video' is read for 'dataset_type': 'video' only; this dataset is "
                      "'image'", problems[0])


class FrameRuleTest(unittest.TestCase):
    def test_snap_down_is_the_largest_accepted_count_not_above(self):
        for rule in (FRAME_RULES["wan"], FrameRule(8, 1), FrameRule(1, 0), FrameRule(4, 0)):
            for frames in range(0, 130):
                snapped = rule.snap_down(frames)
                accepted = [n for n in range(0, frames + 1) if rule.accepts(n)]
                self.assertEqual(snapped, max(accepted, default=0), (rule, frames))
        self.assertEqual([n for n in range(1, 30) if FRAME_RULES["wan"].accepts(n)],
                         [1, 5, 9, 13, 17, 21, 25, 29])


if __name__ == "__main__":
    unittest.main()
