"""The data options through real training runs, in the test process (the launchers are tested
in their own tests): a run with every one of them, random crop aspects, and a resumed run with
caption dropout that ends exactly where the uninterrupted run ends."""

from __future__ import annotations

import json
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from safetensors.torch import load_file

from simpletuner.helpers.metadata.buckets import parse_bucket_key
from simpletuner.helpers.metadata.index_cache import load_cache

from trained_outputs import TrainedOutputAssertions
from training_fixtures import (
    ResumedRunPair, make_shapes, read_jsonl, run_in_process, write_config,
)


class CaptionDropoutResumeTest(TrainedOutputAssertions, ResumedRunPair, unittest.TestCase):
    """Both runs in the test process: what they test is the data, not the launcher."""

    tmp_prefix, per_size, resume_step = "st-dropout-", 4, 3
    launch = staticmethod(run_in_process)
    options = dict(max_train_steps=6, checkpointing_steps=3, caption_dropout_probability=0.5)

    def test_resumed_run_ends_with_the_uninterrupted_weights(self):
        self.assert_resumed_at(self.resumed_out, 3)
        full = load_file(str(self.full_out / "checkpoint-6" / "model.safetensors"))
        resumed = load_file(str(self.resumed_out / "checkpoint-6" / "model.safetensors"))
        worst = max((full[k] - resumed[k]).abs().max().item() for k in full)
        self.assertLessEqual(worst, 1e-6)


class DataOptionsTrainingTest(unittest.TestCase):
    def test_every_data_option_trains(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            ids = make_shapes(root / "data", per_size=8)
            for sample_id in ids:  # a second caption line per image
                caption = root / "data" / sample_id.replace(".png", ".txt")
                caption.write_text(caption.read_text() + "\na simple shape\n")
            dataset = {"id": "shapes", "instance_data_dir": str(root / "data"),
                       "caption_strategy": "textfile", "resolution": 64,
                       "resolution_type": "pixel_area", "crop": True, "crop_style": "corner",
                       "crop_aspect": "closest", "crop_aspect_buckets": [1.0, 1.5],
                       "max_num_samples": 12, "instance_prompt": "shapes",
                       "prepend_instance_prompt": True}
            config = write_config(root, root / "data", datasets=[dataset],
                                  caption_dropout_probability=0.2, max_train_steps=3)
            run_in_process(config)
            out = root / "config-out"
            self.assertEqual(json.loads((out / "training_summary.json").read_text())["steps"], 3)
            skipped = json.loads((out / "skipped_files.json").read_text())["shapes"]
            self.assertEqual(len(skipped), 4)
            self.assertEqual({s["reason"] for s in skipped}, {"beyond max_num_samples 12"})
            buckets = set(load_cache(out / "cache" / "metadata" / "shapes.index").buckets)
            self.assertEqual(buckets, {"64x64", "80x48"})
            # Every line of every kept sample, with 'shapes ' prepended, plus the empty caption
            kept = set(ids) - {s["path"] for s in skipped}
            texts = {f"shapes {line}" for s in kept for line in
                     (root / "data" / s.replace(".png", ".txt")).read_text().splitlines()}
            text_entries = list((out / "cache" / "text").rglob("*.safetensors"))
            self.assertEqual(len(text_entries), len(texts) + 1)


class RandomCropAspectTrainingTest(unittest.TestCase):
    def test_each_sample_trains_at_the_size_of_its_drawn_bucket(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=8)  # 64x64 and 96x64 images
            dataset = {"id": "shapes", "instance_data_dir": str(root / "data"),
                       "caption_strategy": "textfile", "crop": True, "crop_aspect": "random",
                       "crop_aspect_buckets": [0.75, {"aspect_bucket": 1.5, "weight": 1}]}
            config = write_config(root, root / "data", datasets=[dataset], max_train_steps=6,
                                  trace_samples=True)
            run_in_process(config)
            out = root / "config-out"
            cache = load_cache(out / "cache" / "metadata" / "shapes.index")
            members = {key: set(ids) for key, ids in cache.buckets.items()}
            # Closest would put every 64x64 image into 64x80 and every 96x64 one into 96x64.
            self.assertEqual(set(members), {"64x80", "96x64"})
            self.assertTrue(any(s.startswith("64x64") for s in members["96x64"]), members)
            self.assertTrue(any(s.startswith("96x64") for s in members["64x80"]), members)
            self.assert_latents_have_their_bucket_sizes(out, members)
            for record in read_jsonl(out / "trace" / "rank-0.jsonl"):
                self.assertLessEqual(set(record["samples"]), members[record["bucket"]])

    def assert_latents_have_their_bucket_sizes(self, out: Path, members: dict[str, set]):
        expected = Counter({parse_bucket_key(key)[::-1]: len(ids) for key, ids in members.items()})
        entries = [load_file(str(p)) for p in (out / "cache" / "vae").rglob("*.safetensors")]
        targets = Counter(tuple(e["geometry"][4:].tolist()) for e in entries)
        self.assertEqual(targets, expected)  # (height, width) per sample
        scales = {(e["geometry"][4].item() / e["latent"].shape[-2],
                   e["geometry"][5].item() / e["latent"].shape[-1]) for e in entries}
        self.assertEqual(len(scales), 1, scales)  # every latent at its target size


if __name__ == "__main__":
    unittest.main()
