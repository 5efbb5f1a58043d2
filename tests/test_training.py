"""End-to-end training through the real entry point: learning, exact resume, export, traces."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from training_fixtures import ResumedRunPair, make_shapes, read_jsonl, run_training, write_config


def unet_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "unet" / "diffusion_pytorch_model.safetensors"))


class ResumeTest(ResumedRunPair, unittest.TestCase):
    """A 12-step run, and a run resumed from its checkpoint-6, end with the same weights and
    draw the same samples after the checkpoint."""

    tmp_prefix, per_size, resume_step = "st-resume-", 8, 6
    options = dict(max_train_steps=12, checkpointing_steps=6, gradient_accumulation_steps=2,
                   lr_scheduler="cosine", lr_warmup_steps=3, use_ema=True, ema_decay=0.9,
                   ema_update_interval=4, ema_warmup_steps=8,
                   trace_samples=True)

    def test_runs_succeed(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-3000:])
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertIn("resumed from", self.resumed.stderr)

    def test_resumed_run_ends_with_the_uninterrupted_weights(self):
        for folder in ("pipeline", "checkpoint-12"):
            if folder == "pipeline":
                full, resumed = (unet_weights(self.full_out / folder),
                                 unet_weights(self.resumed_out / folder))
            else:
                full = load_file(str(self.full_out / folder / "model.safetensors"))
                resumed = load_file(str(self.resumed_out / folder / "model.safetensors"))
            self.assertEqual(full.keys(), resumed.keys())
            worst = max((full[k] - resumed[k]).abs().max().item() for k in full)
            self.assertLessEqual(worst, 1e-6, f"{folder}: weights differ by {worst}")

    def test_training_changed_the_weights(self):
        start = load_file(str(self.full_out / "checkpoint-6" / "model.safetensors"))
        end = load_file(str(self.full_out / "checkpoint-12" / "model.safetensors"))
        self.assertGreater(max((start[k] - end[k]).abs().max().item() for k in start), 0)

    def test_resumed_run_draws_the_rest_of_the_sample_sequence(self):
        full = read_jsonl(self.full_out / "trace" / "rank-0.jsonl")
        resumed = read_jsonl(self.resumed_out / "trace" / "rank-0.jsonl")
        # 12 optimizer steps of 2 micro-batches: the checkpoint sits after micro-batch 12.
        self.assertEqual(len(full), 24)
        self.assertEqual(resumed, full[12:])

    def test_checkpoint_holds_trainer_and_sampler_state(self):
        state = json.loads((self.full_out / "checkpoint-6" / "trainer_state.json").read_text())
        sampler = json.loads((self.full_out / "checkpoint-6" / "sampler_state.json").read_text())
        self.assertEqual((state["step"], state["seed"], state["model_type"]), (6, 7, "full"))
        self.assertEqual(sampler["step"] + sampler["epoch"] * 8, 12)
        self.assertEqual(state["fingerprint"], sampler["fingerprint"])


class LearningAndExportTest(unittest.TestCase):
    """Loss on a fixed batch falls; the export loads in diffusers and generates; validation
    images and tensorboard events are written."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-learn-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        cls.config = write_config(
            root, root / "data", "learn", max_train_steps=30, train_batch_size=4,
            learning_rate=1e-3, validation_prompt=["a red circle on a blue background"],
            validation_steps=15, validation_num_inference_steps=2, report_to="tensorboard",
            checkpointing_steps=10, checkpoints_total_limit=1)
        cls.result = run_training(cls.config, cls.tmp)
        cls.out = root / "learn-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_run_succeeds(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])

    def test_loss_on_a_fixed_batch_falls(self):
        from simpletuner.configuration import load_configuration
        from simpletuner.helpers.caching.prepare import prepare_caches
        from simpletuner.helpers.metadata.backends.base import MetadataBackend
        from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
        from simpletuner.models.base import LossSettings
        from simpletuner.models.builtin import resolve_model_path
        from simpletuner.families.sd1x.adapter import SD1xAdapter

        configuration = load_configuration(self.config)
        base = resolve_model_path("builtin:tiny-sd1x")
        adapter = SD1xAdapter.load(base, device=torch.device("cpu"), weight_dtype=torch.float32,
                                   loss_settings=LossSettings())
        (dataset,) = configuration.datasets
        backend = MetadataBackend.from_config(dataset, configuration.training)
        index = backend.load_index()
        caches = prepare_caches([dataset], {dataset.id: index}, {dataset.id: backend.caption_for},
                                adapter.encode_images, adapter.encode_prompts, model_folder=base,
                                family="sd1x", output_dir=configuration.training.output_dir,
                                seed=7, rank=0, world_size=1, progress=False)
        ids = index.buckets["64x64"]
        batch = caches.assembler(MicroBatch(0, 0, dataset.id, "64x64", tuple(
            BatchSample(dataset.id, s, "64x64", (64, 64), backend.caption_for(s)) for s in ids)))

        def loss_of(unet) -> float:
            losses = []
            with torch.no_grad():
                for seed in range(8):
                    generator = torch.Generator().manual_seed(seed)
                    losses.append(adapter.compute_loss(batch, generator, network=unet).item())
            return sum(losses) / len(losses)

        before = loss_of(adapter.unet)
        trained = type(adapter.unet).from_pretrained(self.out / "pipeline", subfolder="unet")
        after = loss_of(trained)
        self.assertLess(after, 0.9 * before, f"loss {before:.4f} -> {after:.4f}")

    def test_export_loads_in_diffusers_and_generates(self):
        from diffusers import DiffusionPipeline

        pipeline = DiffusionPipeline.from_pretrained(self.out / "pipeline")
        pipeline.set_progress_bar_config(disable=True)
        image = pipeline("a red circle", height=64, width=96, num_inference_steps=2,
                         generator=torch.Generator().manual_seed(0)).images[0]
        self.assertEqual(image.size, (96, 64))
        self.assertGreater(float(np.asarray(image, dtype=np.float32).std()), 0.0)

    def test_validation_images_and_tensorboard_events_are_written(self):
        for step in (15, 30):
            folder = self.out / "validation" / f"step-{step}"
            self.assertTrue((folder / "image-00.png").is_file(), folder)
            self.assertTrue((folder / "grid.png").is_file(), folder)
        events = list((self.out / "logs").rglob("events.out.tfevents.*"))
        self.assertTrue(events, "no tensorboard event file")
        self.assertGreater(sum(e.stat().st_size for e in events), 1000)

    def test_checkpoints_are_pruned_to_the_limit(self):
        names = sorted(p.name for p in self.out.iterdir() if p.name.startswith("checkpoint-"))
        self.assertEqual(names, ["checkpoint-30"])
        self.assertFalse(list(self.out.glob(".incomplete-*")))


if __name__ == "__main__":
    unittest.main()
