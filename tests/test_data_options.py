"""SimpleTuner's data options: caption dropout, multi-line captions, instance prompts,
pixel_area, crop_aspect closest, corner crops and max_num_samples."""

from __future__ import annotations

import json
import unittest
from collections import Counter

from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.helpers.metadata.buckets import BucketSettings, SizeFilters, bucket_for
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.subset import limit_samples
from simpletuner.helpers.multiaspect.captions import EMPTY_CAPTION, CaptionPolicy
from simpletuner.helpers.multiaspect.image import crop_box
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset


def sample_ids(n: int) -> list[str]:
    return [f"img/{i:05d}.png" for i in range(n)]


def choose_all(policy: CaptionPolicy, text: str, epoch: int, n: int = 4000) -> list[str]:
    return [policy.choose(text, seed=5, dataset_id="d", sample_id=s, epoch=epoch)
            for s in sample_ids(n)]


class CaptionDropoutTest(unittest.TestCase):
    def test_drops_the_expected_fraction_deterministically_and_differently_per_epoch(self):
        policy = CaptionPolicy(dropout_probability=0.25)
        first = choose_all(policy, "a red fox", epoch=0)
        self.assertAlmostEqual(first.count(EMPTY_CAPTION) / len(first), 0.25, delta=0.025)
        self.assertEqual(set(first), {EMPTY_CAPTION, "a red fox"})
        self.assertEqual(first, choose_all(policy, "a red fox", epoch=0))
        self.assertNotEqual(first, choose_all(policy, "a red fox", epoch=1))

    def test_no_dropout_keeps_every_caption(self):
        self.assertEqual(set(choose_all(CaptionPolicy(), "a red fox", epoch=3)), {"a red fox"})

    def test_evaluation_datasets_never_drop(self):
        dataset = DatasetConfig(id="e", instance_data_dir="/x", dataset_type="eval",
                                caption_dropout_probability=0.5)
        self.assertFalse(CaptionPolicy.for_dataset(dataset).may_drop)


class MultilineCaptionTest(unittest.TestCase):
    TEXT = "a red fox\n\n  a fox in snow \na small animal"

    def test_one_line_per_epoch_chosen_deterministically(self):
        policy = CaptionPolicy()
        lines = ["a red fox", "a fox in snow", "a small animal"]
        self.assertEqual(policy.candidates(self.TEXT), lines)
        per_epoch = [choose_all(policy, self.TEXT, epoch, n=600) for epoch in range(3)]
        for chosen in per_epoch:
            counts = Counter(chosen)
            self.assertEqual(set(counts), set(lines))
            self.assertGreater(min(counts.values()), 150)  # about 200 each
        self.assertEqual(per_epoch[1], choose_all(policy, self.TEXT, 1, n=600))
        self.assertNotEqual(per_epoch[0], per_epoch[1])

    def test_disable_multiline_split_keeps_the_whole_text(self):
        policy = CaptionPolicy(split_lines=False)
        self.assertEqual(set(choose_all(policy, self.TEXT, 0, n=50)), {self.TEXT})

    def test_instance_prompt_is_prepended_or_used_alone(self):
        prepend = CaptionPolicy(instance_prompt="sks", prepend_instance_prompt=True)
        self.assertEqual(prepend.candidates("a\nb"), ["sks a", "sks b"])
        only = CaptionPolicy(instance_prompt="sks", only_instance_prompt=True)
        self.assertEqual(only.candidates("a\nb"), ["sks"])


class SamplerCaptionResumeTest(unittest.TestCase):
    def make(self):
        index = DatasetIndex("d", {"64x64": sample_ids(48)}, {})
        dataset = SamplerDataset(index, lambda s: f"{s} one\n{s} two", 2,
                                 captions=CaptionPolicy(dropout_probability=0.3))
        return MultiAspectSampler([dataset], seed=11, processes=2, rank=1, accumulation=1)

    def captions(self, batches) -> list[str]:
        return [s.caption for m in batches for s in m.samples]

    def test_resume_mid_epoch_gives_the_uninterrupted_captions(self):
        full = self.make()
        uninterrupted = self.captions(list(full) + list(full))
        self.assertTrue(any(c == EMPTY_CAPTION for c in uninterrupted))
        self.assertTrue(any(c.endswith(" two") for c in uninterrupted))
        first = self.make()
        consumed = []
        for batch in first:
            consumed.append(batch)
            if len(consumed) == 5:
                break
        resumed = self.make()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        rest = list(resumed) + list(resumed)  # the rest of epoch 0, then epoch 1
        self.assertEqual(self.captions(consumed) + self.captions(rest), uninterrupted)


class BucketOptionsTest(unittest.TestCase):
    training = TrainingConfig(model_family="sd1x", pretrained_model_name_or_path="x",
                              output_dir="o", data_backend_config="d", aspect_bucket_alignment=64)

    def settings(self, **keys) -> BucketSettings:
        return BucketSettings.for_dataset(DatasetConfig(id="d", instance_data_dir="/x", **keys),
                                          self.training)

    def test_pixel_area_trains_at_the_area_of_the_resolution_square(self):
        settings = self.settings(resolution=1024, resolution_type="pixel_area")
        self.assertEqual((settings.resolution_type, settings.resolution), ("area", 1.048576))
        self.assertEqual(bucket_for(1024, 1024, settings), "1024x1024")
        self.assertEqual(bucket_for(1600, 900, settings), "1344x768")  # 1.03 MP, aspect 1.75
        self.assertEqual(bucket_for(900, 1600, settings), "768x1344")

    def test_pixel_area_size_filters_count_edge_lengths(self):
        dataset = DatasetConfig(id="d", instance_data_dir="/x", resolution_type="pixel_area",
                                minimum_image_size=512)
        filters = SizeFilters.for_dataset(dataset, self.training)
        self.assertIsNone(filters.reason_to_skip(1024, 256))   # 512**2 pixels
        self.assertIsNotNone(filters.reason_to_skip(1000, 200))

    def test_crop_aspect_closest_uses_the_nearest_listed_aspect(self):
        settings = self.settings(resolution=512, resolution_type="pixel", crop=True,
                                 crop_aspect="closest", crop_aspect_buckets=[1.5, 0.75, 1.0])
        self.assertEqual(bucket_for(1000, 700, settings), "768x512")   # 1.43 -> 1.5
        self.assertEqual(bucket_for(600, 1000, settings), "512x704")   # 0.6 -> 0.75
        self.assertEqual(bucket_for(1000, 1080, settings), "512x512")  # 0.93 -> 1.0
        self.assertEqual(bucket_for(3000, 1000, settings), "768x512")  # 3.0 -> 1.5

    def test_corner_crop_keeps_the_bottom_right(self):
        self.assertEqual(crop_box((200, 100), (100, 100), "corner"), ((200, 100), (100, 0)))
        self.assertEqual(crop_box((100, 300), (50, 100), "corner"), ((50, 150), (0, 50)))


class MaxNumSamplesTest(unittest.TestCase):
    def test_a_fixed_subset_whatever_the_listing_order(self):
        ids = sample_ids(100)
        index = DatasetIndex("d", {"64x64": ids[:60], "64x128": ids[60:]}, {})
        shuffled = DatasetIndex("d", {"64x128": ids[:59:-1], "64x64": ids[59::-1]}, {})
        limited = limit_samples(index, 30)
        self.assertEqual(limited.sample_count, 30)
        self.assertEqual(limited.buckets, limit_samples(shuffled, 30).buckets)
        self.assertEqual(len(limited.skipped), 70)
        self.assertEqual(limited.skipped[0].reason, "beyond max_num_samples 30")
        other = limit_samples(DatasetIndex("e", index.buckets, {}), 30)
        self.assertNotEqual(limited.buckets, other.buckets)  # keyed by the dataset too
        self.assertIs(limit_samples(index, None), index)


if __name__ == "__main__":
    unittest.main()
