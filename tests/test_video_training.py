"""Wan trained on clips: a clip dataset (full, in the test process), and clips mixed with images
in two real gloo processes through ./train.sh (LoRA), each run once uninterrupted and once
resumed from a copy of its checkpoint-2. The resumed runs end with the uninterrupted runs'
weights and train the same samples at the same steps (the trace); the two-process run trains
every clip and image exactly once in its epoch, each optimizer step from one bucket on both
ranks."""

from __future__ import annotations

import unittest
from pathlib import Path

from safetensors.torch import load_file

from trained_outputs import LORA_WEIGHTS, TRANSFORMER_WEIGHTS, TrainedOutputAssertions
from training_fixtures import TrainingRuns, make_shapes, read_jsonl, run_in_process, run_train_sh
from video_fixtures import write_clip

WAN = dict(model_family="wan", pretrained_model_name_or_path="builtin:tiny-wan", resolution=48,
           train_batch_size=1, trace_samples=True, checkpointing_steps=2)


def clip_datasets(root: Path, with_images: bool) -> list[dict]:
    datasets = [{"id": "clips", "dataset_type": "video", "instance_data_dir": str(root / "clips"),
                 "video": {"bucket_strategy": "resolution_frames"}}]
    if with_images:
        datasets.append({"id": "stills", "instance_data_dir": str(root / "stills")})
    return datasets


class VideoTrainingTest(TrainingRuns, TrainedOutputAssertions, unittest.TestCase):
    tmp_prefix, options = "st-video-", WAN

    @classmethod
    def start_runs(cls):
        root = cls.root
        for i in range(4):  # two frame buckets of one size (64x48@9, @13), one of another
            write_clip(root / "clips" / f"walk{i}.mp4", 64, 48, 9 + 4 * (i % 2), seed=i,
                       caption=f"a square walking, take {i}")
        for i in range(2):
            write_clip(root / "clips" / f"tall{i}.mp4", 48, 64, 9, seed=10 + i)
        cls.stills = make_shapes(root / "stills", per_size=2, sizes=((64, 48),))
        clips = dict(datasets=clip_datasets(root, False), max_train_steps=4)
        cls.train("clips", launch=run_in_process, **clips)
        cls.train_resumed("clips", "clips-resumed", launch=run_in_process, **clips)
        # 6 clips + 2 images, 2 ranks of 1: one epoch is 4 steps
        mixed = dict(datasets=clip_datasets(root, True), model_type="lora", lora_rank=4,
                     learning_rate=3e-2, num_processes=2, num_train_epochs=1,
                     max_train_steps=None)
        cls.mixed, cls.mixed_resumed = cls.train_and_resume("mixed", launch=run_train_sh,
                                                            **mixed)  # two processes

    def trace(self, run: str, rank: int = 0) -> list[dict]:
        return read_jsonl(self.root / f"{run}-out" / "trace" / f"rank-{rank}.jsonl")

    def assert_succeeded(self, *results):
        for result in results:
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])

    def test_clips_train_as_clips_of_their_bucket(self):
        out = self.root / "clips-out"
        buckets = {record["bucket"] for record in self.trace("clips")}
        self.assertLessEqual(buckets, {"64x48@9", "64x48@13", "48x64@9"})
        # cached latents: [C, F', h, w], F' = (F - 1) / 4 + 1 latent frames, 8x smaller sides
        shapes = {tuple(load_file(p)["latent"].shape)
                  for p in (out / "cache" / "vae" / "clips").rglob("*.safetensors")}
        self.assertEqual(shapes, {(16, 3, 6, 8), (16, 4, 6, 8), (16, 3, 8, 6)})
        self.assert_some_tensor_changed(
            self.root / "clips-out" / "checkpoint-2" / "model.safetensors",
            self.root / "clips-out" / "checkpoint-4" / "model.safetensors")

    def test_a_resumed_clip_run_ends_with_the_same_weights_and_trace(self):
        self.assert_resumed_at(self.root / "clips-resumed-out", 2)
        self.assert_same_tensors(self.root / "clips-out" / TRANSFORMER_WEIGHTS,
                                 self.root / "clips-resumed-out" / TRANSFORMER_WEIGHTS)
        whole, resumed = self.trace("clips"), self.trace("clips-resumed")
        self.assertEqual(len(whole), 4)
        self.assertEqual(resumed, whole[2:])  # steps 3 and 4, the same samples

    def test_two_ranks_train_every_clip_and_image_once_in_lockstep(self):
        self.assert_succeeded(self.mixed)
        traces = [self.trace("mixed", rank) for rank in (0, 1)]
        self.assertEqual([len(t) for t in traces], [4, 4])
        for first, second in zip(*traces):
            self.assertEqual((first["dataset"], first["bucket"]),
                             (second["dataset"], second["bucket"]))
        trained = sorted(f"{r['dataset']}/{s}" for t in traces for r in t for s in r["samples"])
        expected = sorted([f"clips/walk{i}.mp4" for i in range(4)]
                          + [f"clips/tall{i}.mp4" for i in range(2)]
                          + [f"stills/{s}" for s in self.stills])
        self.assertEqual(trained, expected)
        self.assertIn("64x48", {r["bucket"] for t in traces for r in t})  # images: 1 frame

    def test_a_resumed_two_rank_mixed_run_ends_with_the_same_adapter_and_traces(self):
        self.assert_succeeded(self.mixed, self.mixed_resumed)
        self.assert_same_tensors(self.root / "mixed-out" / LORA_WEIGHTS,
                                 self.root / "mixed-resumed-out" / LORA_WEIGHTS)
        for rank in (0, 1):
            self.assertEqual(self.trace("mixed-resumed", rank), self.trace("mixed", rank)[2:])


if __name__ == "__main__":
    unittest.main()
