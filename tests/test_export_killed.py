"""A run SIGKILLed in the middle of its final export (the pipeline written into its staging
folder, not yet renamed into place) leaves no pipeline/ that looks complete, and the same
command run again removes the staging folder, resumes at the final checkpoint without training
a step and exports the same weights."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import unittest
from pathlib import Path

from safetensors.torch import load_file

from launching import run_bounded
from simpletuner.training.run.leftovers import leftovers
from training_fixtures import environment, make_shapes, run_in_process_logged, write_config

LAUNCHER = Path(__file__).resolve().parent / "fault_launcher.py"
SAVE = "diffusers.pipelines.pipeline_utils:DiffusionPipeline.save_pretrained"
UNET = Path("pipeline/unet/diffusion_pytorch_model.safetensors")
OPTIONS = dict(max_train_steps=2, resume_from_checkpoint="latest", use_ema=False)


class KilledDuringExportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-export-killed-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=2, sizes=((64, 64),))
        config = write_config(root, root / "data", "killed", **OPTIONS)
        cls.out = root / "killed-out"
        (root / "status").mkdir()
        cls.killed = run_bounded(
            [sys.executable, str(LAUNCHER), str(root / "status"), "--fault", SAVE,
             "--killed-after", "1", "train", "--config", str(config)],
            tmpdir=cls.tmp, timeout=300, env=environment(cls.tmp))
        cls.left_by_kill = leftovers(cls.out)
        cls.staged_weights = [p.name for p in cls.out.glob(".pipeline-*/*/*.safetensors")]
        cls.pipeline_after_kill = (cls.out / "pipeline").exists()
        cls.rerun = run_in_process_logged(config, cls.tmp)  # what a rerun does, in this process
        reference = write_config(root, root / "data", "uninterrupted", **OPTIONS)
        cls.uninterrupted = run_in_process_logged(reference, cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_kill_came_mid_export_and_left_only_its_staging_folder(self):
        self.assertEqual(self.killed.returncode, -signal.SIGKILL, self.killed.stderr[-3000:])
        self.assertFalse(self.pipeline_after_kill)
        self.assertEqual([p.name[:len(".pipeline-")] for p in self.left_by_kill], [".pipeline-"])
        self.assertIn("diffusion_pytorch_model.safetensors", self.staged_weights,
                      "the kill came before the weights reached the staging folder")

    def test_the_rerun_cleans_up_resumes_at_the_end_and_exports_the_same_weights(self):
        for result in (self.rerun, self.uninterrupted):
            self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn(f"removed {self.left_by_kill[0]}, left by an earlier run",
                      self.rerun.stderr)
        self.assertEqual(leftovers(self.out), [])
        self.assertRegex(self.rerun.stderr, r"resumed from \S*checkpoint-2 at step 2 ")
        exported = load_file(str(self.out / UNET))
        expected = load_file(str(Path(self.tmp) / "uninterrupted-out" / UNET))
        self.assertEqual(set(exported), set(expected))
        for key, tensor in expected.items():
            self.assertTrue(exported[key].equal(tensor), key)
        self.assertTrue((self.out / "pipeline" / "README.md").is_file())


if __name__ == "__main__":
    unittest.main()
