"""What a run exports is readable as the umask says: a real export of the built-in pipeline in a
process started with a umask, then the mode of every folder and file it left."""

from __future__ import annotations

import shutil
import stat
import sys
import tempfile
import unittest
from pathlib import Path

from launching import run_bounded
from training_fixtures import environment

# The pipeline exported twice (the second replaces the first) and a LoRA export, then what
# export, validation and checkpoints write beside them through the atomic writes (safetensors'
# save_file among them).
EXPORT = """
import os
import sys
from pathlib import Path
import torch
from diffusers import DiffusionPipeline
from PIL import Image
from simpletuner.common.atomic import atomic_write_text
from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.pipelines import export_pipeline, save_validation_images
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.checkpointing.tensor_files import save_tensors
from simpletuner.training.adapters.lora import add_lora, export_lora

out = Path(sys.argv[1])
os.umask(int(sys.argv[2], 8))  # before anything is written, as a launcher's umask would be
pipeline = DiffusionPipeline.from_pretrained(ensure_builtin_model("tiny-sd1x"))
for _ in range(2):
    folder = export_pipeline(pipeline, out)
family = get_adapter_class("sd1x")
adapter = family.load(ensure_builtin_model("tiny-sd1x"), device=torch.device("cpu"),
                      weight_dtype=torch.float32, loss_settings=LossSettings())
add_lora(adapter.trainable, family, rank=4)
export_lora(family, adapter.trainable, out)
atomic_write_text(folder / "README.md", "model card")
atomic_write_text(out / "training_summary.json", "{}")
save_validation_images([Image.new("RGB", (8, 8))], ["a prompt"], out / "validation" / "step-1")
save_tensors({"w": torch.zeros(2)}, out / "checkpoint-1" / "model.safetensors")
"""


class ExportPermissionsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="st-export-modes-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def export_under(self, umask: int) -> Path:
        out = Path(self.tmp) / f"umask-{umask:03o}"
        result = run_bounded([sys.executable, "-c", EXPORT, str(out), f"{umask:o}"],
                             tmpdir=self.tmp, env=environment(self.tmp), timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        return out

    def modes(self, out: Path) -> dict[str, set[str]]:
        """{'folders': {...}, 'files': {...}}: the permission bits found under out, as octal."""
        found: dict[str, set[str]] = {"folders": set(), "files": set()}
        for path in [out, *out.rglob("*")]:
            kind = "folders" if path.is_dir() else "files"
            found[kind].add(f"{stat.S_IMODE(path.stat().st_mode):o}")
        return found

    def test_an_export_under_umask_022_is_readable_by_others(self):
        out = self.export_under(0o022)
        self.assertTrue((out / "pipeline" / "unet").is_dir())
        self.assertTrue((out / "pipeline" / "README.md").is_file())
        self.assertTrue((out / "lora" / "pytorch_lora_weights.safetensors").is_file())
        self.assertEqual(self.modes(out), {"folders": {"755"}, "files": {"644"}})
        self.assertEqual(sorted(p.name for p in out.iterdir() if p.name.startswith(".")), [])

    def test_an_export_under_umask_027_is_closed_to_others(self):
        # Not a fixed 0644 either: a private umask keeps the export private.
        self.assertEqual(self.modes(self.export_under(0o027)),
                         {"folders": {"750"}, "files": {"640"}})


if __name__ == "__main__":
    unittest.main()
