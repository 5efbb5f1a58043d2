"""The SimpleTuner-style single-GPU Flux LoRA config through the real trainer, on the CPU: an
int8-torchao base, adamw_bf16, frozen components freed after caching. It trains, resumes
exactly, validates, and exports an adapter that diffusers loads onto the unquantized base; and
./train.sh runs the same config with group offload instead."""

from __future__ import annotations

import json
import os
import unittest
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from diffusers import DiffusionPipeline
from safetensors.torch import load_file

from simpletuner.models.builtin import resolve_model_path

from training_fixtures import ResumedRunPair, environment, run_train_sh, write_config

LEAN_FLUX = dict(model_family="flux", pretrained_model_name_or_path="builtin:tiny-flux",
                 model_type="lora", lora_rank=4, lora_alpha=8, learning_rate=5e-3,
                 base_model_precision="int8-torchao", optimizer="adamw_bf16",
                 mixed_precision="bf16", frozen_components_after_caching="free",
                 validation_prompt="a red circle", validation_steps=2,
                 validation_num_inference_steps=2, validation_guidance_scale=1.0,
                 max_train_steps=4, checkpointing_steps=2)


class LeanFluxLoraTest(ResumedRunPair, unittest.TestCase):
    tmp_prefix, per_size, resume_step = "st-lean-flux-", 2, 2
    options = LEAN_FLUX

    def test_runs_succeed_and_free_the_frozen_components(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-3000:])
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertIn("VAE and 2 text encoder(s) freed until validation", self.full.stderr)
        for step in (2, 4):
            self.assertTrue((self.full_out / "validation" / f"step-{step}" / "grid.png").is_file())

    def test_bf16_adapter_resumes_exactly(self):
        for relative in ("checkpoint-4/lora_adapter.safetensors",
                         "lora/pytorch_lora_weights.safetensors"):
            full = load_file(str(self.full_out / relative))
            resumed = load_file(str(self.resumed_out / relative))
            self.assertEqual({t.dtype for t in full.values()}, {torch.bfloat16})
            self.assertTrue(all(torch.equal(full[k], resumed[k]) for k in full), relative)
        optimizer = json.loads((self.full_out / "checkpoint-4" / "optimizer.json").read_text())
        self.assertTrue(optimizer["param_groups"][0]["kahan_sum"])

    def test_export_loads_onto_the_unquantized_base_and_changes_it(self):
        with mock.patch.dict(os.environ, environment(self.tmp)):
            pipeline = DiffusionPipeline.from_pretrained(resolve_model_path("builtin:tiny-flux"))
        pipeline.set_progress_bar_config(disable=True)

        def image():
            result = pipeline(prompt="a red circle", height=64, width=64, num_inference_steps=2,
                              guidance_scale=1.0, generator=torch.Generator().manual_seed(0))
            return np.asarray(result.images[0]).astype(np.float64)

        before = image()
        pipeline.load_lora_weights(self.full_out / "lora")
        self.assertGreater(np.abs(image() - before).mean(), 0.05)

    def test_train_sh_runs_the_config_with_group_offload(self):
        """The frozen components under group offload (text encoders on disk) instead of freed:
        it trains, validates and exports."""
        root = Path(self.tmp)
        config = write_config(root, root / "data", "shell", **{
            **LEAN_FLUX, "frozen_components_after_caching": "offload",
            "enable_group_offload": True, "group_offload_to_disk_path": str(root / "offload")})
        result = run_train_sh(config, self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("group offload (block_level): vae, text_encoder, text_encoder_2 held on "
                      "the host, the text encoders' weights in", result.stderr)
        self.assertEqual(len(list((root / "offload").glob("*-rank0/text_encoder*/*.safetensors"))),
                         2)
        for step in (2, 4):
            self.assertTrue((root / "shell-out" / "validation" / f"step-{step}" / "grid.png")
                            .is_file())
        self.assertTrue((root / "shell-out" / "lora" / "pytorch_lora_weights.safetensors")
                        .is_file())


if __name__ == "__main__":
    unittest.main()
