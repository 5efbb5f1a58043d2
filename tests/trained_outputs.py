"""What the training tests compare between runs: weights files tensor by tensor, the image a
pipeline samples for a fixed prompt and seed, and a tiny SD 1.x UNet's output for fixed inputs."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from safetensors.torch import load_file

from training_fixtures import environment

TRANSFORMER_WEIGHTS = "pipeline/transformer/diffusion_pytorch_model.safetensors"
LORA_WEIGHTS = "lora/pytorch_lora_weights.safetensors"


def file_data_sha256(path: Path) -> str:
    """sha256 (hex) of a safetensors file's bytes after its header, as web UIs hash it."""
    data = Path(path).read_bytes()
    return hashlib.sha256(data[8 + int.from_bytes(data[:8], "little"):]).hexdigest()


def tiny_sd1x_unet(tmp: str):
    """builtin:tiny-sd1x's UNet as the runs under ``tmp`` loaded it, in eval mode."""
    from diffusers import UNet2DConditionModel

    from simpletuner.models.builtin import resolve_model_path

    with mock.patch.dict(os.environ, environment(tmp)):
        folder = Path(resolve_model_path("builtin:tiny-sd1x"))
    return UNet2DConditionModel.from_pretrained(folder / "unet").eval()


def unet_output(unet) -> torch.Tensor:
    """The UNet's prediction for seeded latents and text context at timestep 500."""
    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(1, 4, 8, 8, generator=generator)
    context = torch.randn(1, 77, unet.config.cross_attention_dim, generator=generator)
    with torch.no_grad():
        return unet(latents, torch.tensor([500]), context).sample


class TrainedOutputAssertions:
    """Mixed into a unittest.TestCase."""

    def assert_same_tensors(self, first: Path, second: Path):
        """The two safetensors files hold the same names and bit-equal tensors."""
        one, other = load_file(str(first)), load_file(str(second))
        self.assertEqual(set(one), set(other), f"{first} and {second} name different tensors")
        for name, tensor in one.items():
            self.assertTrue(torch.equal(tensor, other[name]),
                            f"{name}: differs by up to "
                            f"{(tensor.float() - other[name].float()).abs().max().item()}")

    def assert_some_tensor_changed(self, before: Path, after: Path):
        """At least one tensor of ``before`` differs in ``after`` (training moved it)."""
        one, other = load_file(str(before)), load_file(str(after))
        self.assertFalse(all(torch.equal(one[name], other[name]) for name in one),
                         f"every tensor of {before} is unchanged in {after}")

    def assert_resumed_at(self, output_dir: Path, step: int):
        """The run that wrote ``output_dir`` resumed from its checkpoint-<step> (and did not
        train from the start, which with the same seed would end with the same weights)."""
        status = json.loads((Path(output_dir) / "training_status.json").read_text())
        self.assertEqual((status["resume_step"], status["status"]), (step, "finished"))

    def assert_resumed_lora_matches(self, root: Path, run, resumed, steps=(2, 4)):
        """``resumed`` (run "<run.name>-resumed" from a copy of checkpoint-<steps[0]>) ends with
        the LoRA of ``run``, which trained on between its two checkpoints; both are the
        finished processes of runs writing root/<name>-out."""
        (name, first), (resumed_name, second) = run, resumed
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        self.assertEqual(second.returncode, 0, second.stderr[-3000:])
        self.assertIn("resumed from", second.stderr)
        self.assert_same_tensors(root / f"{name}-out" / LORA_WEIGHTS,
                                 root / f"{resumed_name}-out" / LORA_WEIGHTS)
        start, end = (root / f"{name}-out" / f"checkpoint-{step}" / "lora_adapter.safetensors"
                      for step in steps)
        self.assert_some_tensor_changed(start, end)

    def sample_image(self, pipeline, width: int = 96, height: int = 64,
                     **call) -> np.ndarray:
        """The pipeline's image for "a red circle", 2 steps, seed 0, of the size asked for."""
        pipeline.set_progress_bar_config(disable=True)
        image = pipeline(prompt="a red circle", height=height, width=width,
                         num_inference_steps=2, generator=torch.Generator().manual_seed(0),
                         **call).images[0]
        self.assertEqual(image.size, (width, height))
        return np.asarray(image).astype(np.float64)


class ResumedAdapterRun(TrainedOutputAssertions):
    """Mixed into a ResumedRunPair TestCase of 8 steps checkpointed every 4 and resumed at 4:
    the resumed run ends with the uninterrupted run's adapter, bit for bit."""

    def test_resume_ends_with_the_uninterrupted_adapter(self):
        for relative in ("checkpoint-8/lora_adapter.safetensors",
                         "lora/pytorch_lora_weights.safetensors"):
            self.assert_same_tensors(self.full_out / relative, self.resumed_out / relative)
        self.assert_some_tensor_changed(self.full_out / "checkpoint-4" / "lora_adapter.safetensors",
                                        self.full_out / "checkpoint-8" / "lora_adapter.safetensors")
