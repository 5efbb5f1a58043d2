"""LoRA on an int8- or NF4-quantized frozen base (torchao, optimum-quanto, bitsandbytes), for a UNet family
(sd1x) and transformer families (flux, chroma, wan): the base layers really hold quantized weights,
the loss on a fixed batch falls, a checkpoint resumes exactly, and the exported adapter loads with
load_lora_weights onto the *unquantized* base pipeline and changes its output."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import DiffusionPipeline

from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.pipelines import first_image
from simpletuner.training.adapters.lora import add_lora, export_lora
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.memory.quantization import quantize_frozen_weights
from simpletuner.training.settings import OptimizerSettings, PrecisionSettings

from lean_fixtures import (evaluation_loss, largest_difference, memory_settings,
                           resume_training, save_training, train_steps, trained_tensors)
from model_fixtures import TinyModelCase, random_batch

QUANTIZED_BY = {"int8-torchao": "torchao", "int8-quanto": "optimum.quanto",
                "nf4-bnb": "bitsandbytes"}  # bitsandbytes' CPU backend runs NF4


def first_base_layer(network: torch.nn.Module, suffix: str = "to_q") -> torch.nn.Module:
    """The frozen layer under the first LoRA-wrapped ``suffix`` projection."""
    for name, module in network.named_modules():
        if name.endswith(suffix) and hasattr(module, "base_layer"):
            return module.base_layer
    raise AssertionError(f"no LoRA-wrapped {suffix} in {type(network).__name__}")


class QuantizedLoraTest(TinyModelCase):
    def quantized_lora(self, family: str, settings):
        adapter = self.load(family)
        quantize_frozen_weights(adapter, PrecisionSettings.from_config(settings), torch.float32)
        add_lora(adapter.trainable, type(adapter), rank=4, alpha=8)
        return adapter

    def test_lora_on_an_int8_base_trains_resumes_and_exports(self):
        for family in ("sd1x", "flux", "chroma", "wan"):
            for precision, library in QUANTIZED_BY.items():
                with self.subTest(family=family, precision=precision):
                    self.check(family, memory_settings(base_model_precision=precision,
                                                       model_family=family,
                                                       learning_rate=5e-3), library)

    def check(self, family: str, settings, library: str):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        adapter = self.quantized_lora(family, settings)
        weight = first_base_layer(adapter.trainable).weight
        self.assertTrue(type(weight).__module__.startswith(library), type(weight))
        batch = random_batch(adapter, 2)
        optimizer = build_optimizer(adapter.trainable, OptimizerSettings.from_config(settings))
        before = evaluation_loss(adapter, batch, settings)
        train_steps(adapter, optimizer, batch, settings, range(3))
        save_training(adapter, optimizer, folder / "checkpoint", lora=True)
        train_steps(adapter, optimizer, batch, settings, range(3, 6))
        self.assertLess(evaluation_loss(adapter, batch, settings), before)

        resumed = self.quantized_lora(family, settings)
        resumed_optimizer = resume_training(resumed, settings, folder / "checkpoint", lora=True)
        train_steps(resumed, resumed_optimizer, batch, settings, range(3, 6))
        self.assertEqual(largest_difference(trained_tensors(adapter.trainable),
                                            trained_tensors(resumed.trainable)), 0.0)
        self.assert_export_changes_the_unquantized_base(adapter, folder, family)

    def assert_export_changes_the_unquantized_base(self, adapter, folder: Path, family: str):
        exported = export_lora(type(adapter), adapter.trainable, folder)
        pipeline = DiffusionPipeline.from_pretrained(ensure_builtin_model(f"tiny-{family}"))
        pipeline.set_progress_bar_config(disable=True)
        component = getattr(pipeline, adapter.trainable_component)
        self.assertIs(type(component.get_parameter(
            next(n for n, _ in component.named_parameters() if "to_q" in n))), torch.nn.Parameter)

        def image():
            result = pipeline(prompt="a red circle", height=64, width=64, num_inference_steps=2,
                              generator=torch.Generator().manual_seed(0),
                              **adapter.validation_arguments({}))  # Wan: one frame
            return np.asarray(first_image(result)).astype(np.float64)

        before = image()
        pipeline.load_lora_weights(exported.parent)
        self.assertGreater(np.abs(image() - before).mean(), 0.05)


if __name__ == "__main__":
    unittest.main()
