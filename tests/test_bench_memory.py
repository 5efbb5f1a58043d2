"""benchmarks/bench_memory.py computes device bytes from parameter shapes on the meta device;
on the tiny models, which really run here, those numbers equal the bytes of the tensors the
trainer creates: quantized frozen weights (inner tensors of torchao and quanto weights
counted), LoRA weights, gradients after a backward pass and optimizer state after a step."""

from __future__ import annotations

import importlib.util
import unittest

import torch

from simpletuner.training.lora import add_lora
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.memory.quantization import quantize_frozen_weights

from lean_fixtures import TinyDenoiser, memory_settings
from model_fixtures import TinyModelCase, random_batch
from training_fixtures import REPO


def _load_benchmark():
    """benchmarks/ is a folder of scripts, not a package: load the file itself."""
    spec = importlib.util.spec_from_file_location("bench_memory",
                                                  REPO / "benchmarks" / "bench_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_memory = _load_benchmark()

BF16 = torch.bfloat16


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Storage of a tensor; a quantized one by the tensors it is made of."""
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(
            tensor, "__tensor_flatten__"):
        parts, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, part)) for part in parts)
    return tensor.numel() * tensor.element_size()


def measured_weights(network: torch.nn.Module) -> dict:
    frozen = sum(tensor_bytes(p) for p in network.parameters() if not p.requires_grad)
    frozen += sum(tensor_bytes(b) for b in network.buffers())
    trainable = sum(tensor_bytes(p) for p in network.parameters() if p.requires_grad)
    return {"frozen": frozen, "trainable": trainable}


def measured_state(optimizer) -> int:
    state = optimizer.state_dict()
    values = [v for entries in state["state"].values() for v in entries.values()]
    values += [v for group in state["param_groups"] for v in group.values()]
    return sum(tensor_bytes(v) for v in values if isinstance(v, torch.Tensor))


def meta_network(family: str, lora_rank: int | None, adapter_class) -> torch.nn.Module:
    """The benchmark's own copy: the tiny config on the meta device, as real sizes are built."""
    build, _ = bench_memory.tiny_models()[f"tiny-{family}"]
    network = bench_memory.on_meta(build).to(BF16)
    if lora_rank:
        add_lora(network, adapter_class, rank=lora_rank)
    return network


class ComputedEqualsMeasuredTest(TinyModelCase):
    def test_frozen_and_lora_weights_for_each_precision(self):
        for family in ("sd1x", "flux"):
            for precision in ("no_change", "int8-torchao", "int8-quanto", "int4-quanto"):
                with self.subTest(family=family, precision=precision):
                    adapter = self.load(family)
                    settings = memory_settings(base_model_precision=precision)
                    quantize_frozen_weights(adapter, settings, BF16)
                    add_lora(adapter.trainable, type(adapter), rank=4)
                    build_optimizer(adapter.trainable, settings)
                    computed = bench_memory.memory_row(
                        meta_network(family, 4, type(adapter)), precision, "adamw", BF16)
                    measured = measured_weights(adapter.trainable)
                    self.assertEqual(measured, {k: computed[k] for k in measured})

    def test_gradients_and_state_of_each_optimizer(self):
        """Full training of the tiny UNet: every parameter shape (4-D convolutions too)."""
        for optimizer in ("adamw", "adamw_bf16", "prodigy", "adafactor", "lion"):
            with self.subTest(optimizer=optimizer):
                adapter = self.load("sd1x")
                settings = memory_settings(optimizer=optimizer, model_type="full",
                                           mixed_precision="bf16")
                built = build_optimizer(adapter.trainable, settings)
                computed = bench_memory.memory_row(meta_network("sd1x", None, type(adapter)),
                                                   "no_change", optimizer, BF16)
                if optimizer == "prodigy":  # p0 of an all-zero parameter is one number
                    computed["optimizer_state"] -= sum(
                        (p.numel() - 1) * p.element_size()
                        for p in adapter.trainable.parameters() if not p.any())
                self.assert_step_matches(adapter, random_batch(adapter, 1), built, settings,
                                         computed)

    def test_8bit_state(self):
        model = TinyDenoiser()
        settings = memory_settings(optimizer="ao-adamw8bit", model_type="full")
        built = build_optimizer(model.trainable, settings)
        computed = {"gradients": sum(p.numel() * 4 for p in model.trainable.parameters()),
                    "optimizer_state": bench_memory.optimizer_state_bytes(
                        "ao-adamw8bit", list(model.trainable.parameters()))}
        self.assert_step_matches(model, torch.randn(4, 64), built, settings, computed)

    def assert_step_matches(self, model, batch, optimizer, settings, computed):
        with torch.autocast("cpu", dtype=BF16):
            loss = model.compute_loss(batch, torch.Generator().manual_seed(0))
        loss.backward()
        gradients = sum(tensor_bytes(p.grad) for p in model.trainable.parameters())
        self.assertEqual(gradients, computed["gradients"])
        optimizer.step()
        self.assertEqual(measured_state(optimizer), computed["optimizer_state"])


if __name__ == "__main__":
    unittest.main()
