"""Tiny built-in models for the adapter, pipeline and LoRA tests: a private model cache per test
class, adapters loaded on the CPU in float32, small batches, and the checks several files make
(loss falls under AdamW, an export loads in diffusers with the trained weights)."""

from __future__ import annotations

import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch
from diffusers import DiffusionPipeline

from simpletuner.models.base import LossSettings

from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class

CPU = torch.device("cpu")
SHAPE_PROMPTS = ("a red circle", "a blue square", "a green triangle", "a yellow star")


class TinyModelCase(unittest.TestCase):
    """Built-in tiny models are built into a cache private to the test class."""

    @classmethod
    def setUpClass(cls):
        cls.cache = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        cls.enterClassContext(mock.patch.dict(os.environ, {"SIMPLETUNER_CACHE": str(cls.cache)}))

    def load(self, family: str, **loss):
        """The adapter of builtin:tiny-<family>; ``loss`` are LossSettings fields."""
        return get_adapter_class(family).load(
            ensure_builtin_model(f"tiny-{family}"), device=CPU, weight_dtype=torch.float32,
            loss_settings=LossSettings(**loss))

    def assert_block_swap_moves(self, adapter, frozen_part: torch.nn.Module) -> None:
        """move_to as block swap calls it: the host block stays, the rest of the network and
        ``frozen_part`` (a family's own frozen module) go to the device (meta here)."""
        host_block = adapter.transformer.blocks[0]
        adapter.move_to(torch.device("meta"), except_modules=[host_block])
        self.assertTrue(all(p.device == CPU for p in host_block.parameters()))
        self.assertTrue(adapter.transformer.proj_out.weight.is_meta)
        self.assertTrue(all(p.is_meta for p in frozen_part.parameters()))

    def capture_network_inputs(self, adapter, batch, seed: int = 5):
        """compute_loss with a network that records its inputs and predicts zeros: the loss is
        then the mean square of the target."""
        seen = {}

        def zero_network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(seed),
                                    network=zero_network)
        return loss, seen

    def assert_export_loads(self, adapter, folder: Path, class_name: str, width: int,
                            height: int):
        """The exported pipeline at ``folder`` loads as ``class_name`` with the adapter's
        current weights and generates a ``width`` x ``height`` image, which it returns."""
        loaded = DiffusionPipeline.from_pretrained(folder)
        self.assertEqual(type(loaded).__name__, class_name)
        trained = adapter.trainable.state_dict()
        exported = getattr(loaded, adapter.trainable_component)
        for key, value in exported.state_dict().items():
            self.assertTrue(torch.equal(value, trained[key]), key)
        loaded.set_progress_bar_config(disable=True)
        image = loaded(prompt="a red circle", width=width, height=height, num_inference_steps=2,
                       generator=torch.Generator().manual_seed(0)).images[0]
        self.assertEqual(image.size, (width, height))
        return image


def random_batch(adapter, count: int, height: int = 64, width: int = 64, *, seed: int = 7,
                 prompts=SHAPE_PROMPTS, original_sizes=None) -> TrainingBatch:
    """``count`` seeded random images of height x width with the first ``count`` prompts,
    uncropped; ``original_sizes`` defaults to the image size."""
    pixels = torch.rand(count, 3, height, width, generator=torch.Generator().manual_seed(seed))
    return TrainingBatch(
        latents=adapter.encode_images(pixels * 2 - 1),
        prompt_embeds=adapter.encode_prompts(list(prompts[:count])),
        original_sizes=list(original_sizes or [(height, width)] * count),
        crop_top_lefts=[(0, 0)] * count, target_sizes=[(height, width)] * count)


def losses_around_training(adapter, batch: TrainingBatch, *, lr: float,
                           steps: int) -> tuple[float, float]:
    """Summed loss over four fixed generators, before and after ``steps`` AdamW steps."""

    def evaluation_loss():
        with torch.no_grad():
            return sum(adapter.compute_loss(batch, torch.Generator().manual_seed(seed)).item()
                       for seed in range(4))

    before = evaluation_loss()
    optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=lr)
    for step in range(steps):
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(100 + step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return before, evaluation_loss()


def network_prediction(adapter, batch: TrainingBatch) -> torch.Tensor:
    """The trained network's output inside the family's loss, for a fixed noise draw (a
    Z-Image network returns one tensor per image: flattened together)."""
    captured = []

    def keep(module, inputs, output):
        sample = output[0]
        captured.append(torch.cat([t.flatten() for t in sample]) if isinstance(sample, list)
                        else sample.detach().clone())

    hook = adapter.trainable.register_forward_hook(keep)
    try:
        with torch.no_grad():
            adapter.compute_loss(batch, torch.Generator().manual_seed(11))
    finally:
        hook.remove()
    return captured[0]


def train_adapter(adapter, batch: TrainingBatch, steps: int = 2, lr: float = 1e-2) -> None:
    """``steps`` AdamW steps on the parameters that require grad (an adapter's)."""
    parameters = [p for p in adapter.trainable.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr)
    for step in range(steps):
        adapter.compute_loss(batch, torch.Generator().manual_seed(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
