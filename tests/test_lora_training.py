"""LoRA through the real trainer: adapter-only checkpoints, exact resume, an export that
load_lora_weights puts on the base pipeline, and each bad input refused with its message."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from safetensors.torch import load_file

from simpletuner.training.checkpointing.manifest import write_manifest

from trained_outputs import ResumedAdapterRun
from training_fixtures import (
    ResumedRunPair, environment, make_shapes, read_jsonl, run_in_process, run_training,
    write_config)

LORA = dict(model_type="lora", lora_rank=4, lora_alpha=8, learning_rate=5e-3)


class LoraResumeAndExportTest(ResumedAdapterRun, ResumedRunPair, unittest.TestCase):
    """An 8-step LoRA run (two epochs) with EMA and a run resumed from its checkpoint-4 end with
    the same adapter; both in this process (the launchers are tested once, in their own
    tests)."""

    tmp_prefix, per_size, resume_step = "st-lora-", 4, 4
    launch = staticmethod(run_in_process)
    options = dict(LORA, max_train_steps=8, checkpointing_steps=4, use_ema=True,
                   ema_decay=0.9, lr_scheduler="cosine", trace_samples=True)

    def test_the_resumed_run_resumed_at_its_checkpoint_and_drew_the_rest(self):
        self.assert_resumed_at(self.resumed_out, 4)
        trace = read_jsonl(self.resumed_out / "trace" / "rank-0.jsonl")
        self.assertEqual(trace, read_jsonl(self.full_out / "trace" / "rank-0.jsonl")[4:])

    def test_checkpoints_hold_only_adapter_weights(self):
        folder = self.full_out / "checkpoint-4"
        names = {p.name for p in folder.iterdir()}
        self.assertIn("lora_adapter.safetensors", names)
        self.assertNotIn("model.safetensors", names)
        adapter = load_file(str(folder / "lora_adapter.safetensors"))
        self.assertTrue(all(".lora_A." in k or ".lora_B." in k for k in adapter), list(adapter))
        ema = load_file(str(folder / "ema.safetensors"))
        self.assertTrue(all("lora_" in k for k in ema))
        state = json.loads((folder / "trainer_state.json").read_text())
        self.assertEqual(state["model_type"], "lora")

    def test_export_is_an_adapter_that_changes_the_base_pipeline(self):
        from diffusers import DiffusionPipeline

        from simpletuner.models.builtin import resolve_model_path

        self.assertFalse((self.full_out / "pipeline").exists())
        lora = self.full_out / "lora"
        self.assertEqual(sorted(p.name for p in lora.iterdir()),
                         ["README.md", "pytorch_lora_weights.safetensors"])  # + the model card
        summary = json.loads((self.full_out / "training_summary.json").read_text())
        self.assertEqual(summary["lora"], str(lora / "pytorch_lora_weights.safetensors"))
        with mock.patch.dict(os.environ, environment(self.tmp)):
            pipeline = DiffusionPipeline.from_pretrained(resolve_model_path("builtin:tiny-sd1x"))
        pipeline.set_progress_bar_config(disable=True)

        def image():
            result = pipeline(prompt="a red circle on a blue background", height=64, width=64,
                              num_inference_steps=2, generator=torch.Generator().manual_seed(0))
            return np.asarray(result.images[0]).astype(np.float64)

        before = image()
        pipeline.load_lora_weights(lora)
        self.assertGreater(np.abs(image() - before).mean(), 0.5)


class LoraBadInputTest(unittest.TestCase):
    """Configuration and preflight refusals are checked in process (they happen before any
    model loads); the target-module error comes from a real run."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-lora-bad-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.enterClassContext(mock.patch.dict(os.environ, environment(cls.tmp)))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def config(self, name: str, **options) -> Path:
        return write_config(self.root, self.root / "data", name, **options)

    def assert_refused_before_training(self, config: Path, *fragments: str):
        from simpletuner.configuration import ConfigError, load_configuration
        from simpletuner.training.preflight import run_preflight

        with self.assertRaises(ConfigError) as caught:
            run_preflight(load_configuration(config))
        for fragment in fragments:
            self.assertIn(fragment, str(caught.exception))

    def test_out_of_range_options(self):
        self.assert_refused_before_training(self.config("rank", **dict(LORA, lora_rank=0)),
                                            "lora_rank")
        self.assert_refused_before_training(
            self.config("dropout", **dict(LORA, lora_dropout=1.5)), "lora_dropout")
        self.assert_refused_before_training(
            self.config("empty", **dict(LORA, lora_target_modules=[])),
            "lora_target_modules", "empty list")

    def test_resuming_across_model_types_is_refused(self):
        """trainer_state.json of a checkpoint records its model_type; each kind resumed as
        the other is refused in preflight."""
        for kind, other in (("lora", "full"), ("full", "lora")):
            with self.subTest(checkpoint=kind):
                checkpoint = self.root / f"{kind}-checkpoint" / "checkpoint-2"
                checkpoint.mkdir(parents=True)
                (checkpoint / "trainer_state.json").write_text(json.dumps(
                    {"step": 2, "epoch": 0, "seed": 7, "fingerprint": {}, "model_type": kind}))
                write_manifest(checkpoint)  # a folder is a checkpoint only with its manifest
                self.assert_refused_before_training(
                    self.config(f"{kind}-as-{other}", resume_from_checkpoint=str(checkpoint),
                                **(LORA if other == "lora" else {})),
                    f"was saved by a model_type '{kind}' run", f"this run is '{other}'")

    def test_target_modules_that_match_nothing_name_the_family_modules(self):
        result = run_training(self.config("targets", **dict(LORA, lora_target_modules=["to_qq"])),
                              self.tmp)
        self.assertEqual(result.returncode, 1)
        for fragment in ("['to_qq']", "sd1x", "to_q", "to_out.0"):
            self.assertIn(fragment, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertFalse((self.root / "targets-out" / "cache" / "vae").exists())  # no caching


if __name__ == "__main__":
    unittest.main()
