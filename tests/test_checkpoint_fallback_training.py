"""Through the real trainer: the newest checkpoint's weights are damaged on disk; a run resumed
with 'latest' warns once naming the file, resumes from the checkpoint before it, replaces the
damaged one, and ends with finite weights equal to the undamaged run's."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load_file

from simpletuner.training.checkpointing.manifest import verify_checkpoint
from training_fixtures import make_shapes, run_in_process_logged, write_config

OPTIONS = dict(max_train_steps=4, checkpointing_steps=2)


def unet_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(output_dir / "pipeline" / "unet" / "diffusion_pytorch_model.safetensors"))


class ResumeAfterCorruptionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-ckpt-fallback-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4, sizes=((64, 64),))
        cls.out = root / "run-out"
        cls.first = run_in_process_logged(write_config(root, root / "data", "run", **OPTIONS), cls.tmp)
        if cls.first.returncode != 0:
            return
        cls.undamaged = unet_weights(cls.out)
        cls.damaged = cls.out / "checkpoint-4" / "model.safetensors"
        with open(cls.damaged, "r+b") as handle:  # tensor data, not the header: loads "fine"
            handle.seek(cls.damaged.stat().st_size - 4000)
            handle.write(os.urandom(2000))
        cls.resumed = run_in_process_logged(write_config(root, root / "data", "run",
                                                resume_from_checkpoint="latest", **OPTIONS),
                                   cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-3000:])

    def test_resume_warns_once_and_uses_the_previous_checkpoint(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        warnings = [line for line in self.resumed.stderr.splitlines() if "skipping" in line]
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn(str(self.damaged), warnings[0])
        self.assertIn("SHA-256 mismatch", warnings[0])
        self.assertIn(f"resumed from {self.out / 'checkpoint-2'} at step 2", self.resumed.stderr)

    def test_final_weights_are_finite_and_those_of_the_undamaged_run(self):
        final = unet_weights(self.out)
        self.assertTrue(all(bool(torch.isfinite(t).all()) for t in final.values()))
        worst = max((final[k] - self.undamaged[k]).abs().max().item() for k in final)
        self.assertLessEqual(worst, 1e-6)

    def test_the_damaged_checkpoint_was_replaced_by_a_good_one(self):
        verify_checkpoint(self.out / "checkpoint-4")
        self.assertEqual(sorted(p.name for p in self.out.iterdir() if "checkpoint" in p.name),
                         ["checkpoint-2", "checkpoint-4"])


if __name__ == "__main__":
    unittest.main()
