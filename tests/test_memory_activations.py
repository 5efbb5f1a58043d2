"""The plan's activation estimate (training/memory/activations.py, a meta-device run of the
family's loss) against a measurement: the same micro-batch through the real tiny model on the
CPU, every tensor autograd saves for the backward caught by a saved-tensor hook and counted
once per storage (data pointer), the trained parameters left out. Within 25 % for every
transformer family (Wan with images and 5-frame clips), full and LoRA; with gradient
checkpointing (Flux, Wan) within 25 % of what a checkpointed run holds. And against torch's
profiler (benchmarks/bench_activation_profiler.py): the bytes its allocation events show live
when the backward starts, LoRA, every transformer family."""

from __future__ import annotations

import importlib.util
import sys
import unittest
from unittest import mock

import torch

from model_fixtures import TinyModelCase
from training_fixtures import REPO
from simpletuner.configuration.families import FLOW_FAMILIES
from simpletuner.configuration.options import TrainingConfig
from simpletuner.models.base import PLANNED_CAPTION
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.activations import activation_bytes
from simpletuner.training.memory.model import meta_network

TOLERANCE = 0.25
# A mixture of experts' routing depends on the data: the plan counts every token at every
# routed expert, an upper bound the tiny HiDream (4 routed experts, 2 per token) reaches at
# experts / per-token. Its estimate must lie between what is measured and that bound.
ROUTED_BOUND = {"hidream": 4 / 2}
# Not estimated yet (the issue notes say so): LTX-2's text connectors and audio VAE, which
# its prompts and sound go through, are loaded with their weights, not built on the meta device.
NOT_ESTIMATED = {"ltxvideo2"}
ESTIMATED = tuple(family for family in FLOW_FAMILIES if family not in NOT_ESTIMATED)


def assert_estimate_fits(case: unittest.TestCase, family: str, estimate: int, measured: int):
    bound = ROUTED_BOUND.get(family, 1.0)
    case.assertGreaterEqual(estimate, measured * (1 - TOLERANCE),
                            f"estimated {estimate}, measured {measured}")
    case.assertLessEqual(estimate, measured * bound * (1 + TOLERANCE),
                         f"estimated {estimate}, measured {measured}")
HEIGHT, WIDTH = 64, 96  # a landscape bucket


def config(family: str, model_type: str) -> TrainingConfig:
    return TrainingConfig(model_family=family, model_type=model_type, lora_rank=4,
                          pretrained_model_name_or_path=f"builtin:tiny-{family}",
                          output_dir="unused", data_backend_config="unused")


def measured_saved_bytes(adapter, batch: TrainingBatch) -> int:
    parameters = {id(p) for p in adapter.trainable.parameters()}
    storages = {}

    def pack(tensor):
        if id(tensor) not in parameters and id(tensor._base) not in parameters:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        adapter.compute_loss(batch, torch.Generator().manual_seed(0))
    return sum(storages.values())


class ActivationEstimateTest(TinyModelCase):
    def real_batch(self, adapter, count: int, frames: int) -> TrainingBatch:
        shape = (count, 3, HEIGHT, WIDTH) if frames == 1 else (count, 3, frames, HEIGHT, WIDTH)
        pixels = torch.rand(shape, generator=torch.Generator().manual_seed(3)) * 2 - 1
        return TrainingBatch(latents=adapter.encode_images(pixels),
                             prompt_embeds=adapter.encode_prompts([PLANNED_CAPTION] * count),
                             original_sizes=[(HEIGHT, WIDTH)] * count,
                             crop_top_lefts=[(0, 0)] * count,
                             target_sizes=[(HEIGHT, WIDTH)] * count)

    def check(self, family: str, frames: int = 1):
        for model_type in ("full", "lora"):
            with self.subTest(family=family, model_type=model_type, frames=frames):
                training = config(family, model_type)
                adapter = self.load(family)
                if model_type == "lora":
                    add_adapter(adapter.trainable, type(adapter), training)
                measured = measured_saved_bytes(adapter, self.real_batch(adapter, 2, frames))
                folder = ensure_builtin_model(f"tiny-{family}")
                estimate = activation_bytes(type(adapter), folder, training,
                                            meta_network(type(adapter), folder, training),
                                            batch_size=2, height=HEIGHT, width=WIDTH,
                                            frames=frames)
                assert_estimate_fits(self, family, estimate.saved, measured)

    def test_every_transformer_family(self):
        for family in ESTIMATED:
            self.check(family)

    def test_wan_clips(self):
        self.check("wan", frames=5)

    def test_gradient_checkpointing(self):
        """Measured as what a checkpointed run holds: the tensors saved outside the blocks (a
        hook outside sees only those), every block's inputs (a forward pre-hook), and the
        largest block's saved tensors (an uncheckpointed run, a hook around each block)."""
        for family in ("flux", "wan"):
            with self.subTest(family=family):
                training = config(family, "full")
                adapter = self.load(family)
                batch = self.real_batch(adapter, 2, 1)
                blocks = adapter.swappable_blocks(adapter.trainable)
                largest = max(self.saved_in_block(adapter, batch, block) for block in blocks)
                adapter.set_gradient_checkpointing(True)
                inputs = []
                hooks = [block.register_forward_pre_hook(
                    lambda _, args, kwargs: inputs.append(sum(
                        t.untyped_storage().nbytes() for t in (*args, *kwargs.values())
                        if isinstance(t, torch.Tensor))), with_kwargs=True) for block in blocks]
                outside = measured_saved_bytes(adapter, batch)
                for hook in hooks:
                    hook.remove()
                measured = outside + sum(inputs) + largest
                folder = ensure_builtin_model(f"tiny-{family}")
                estimate = activation_bytes(type(adapter), folder, training,
                                            meta_network(type(adapter), folder, training),
                                            batch_size=2, height=HEIGHT, width=WIDTH)
                held = estimate.held(True)
                self.assertLessEqual(abs(held - measured) / measured, TOLERANCE,
                                     f"estimated {held}, measured {measured}")

    def saved_in_block(self, adapter, batch: TrainingBatch, block: torch.nn.Module) -> int:
        """Bytes saved for the backward while ``block`` runs (no checkpointing)."""
        parameters = {id(p) for p in adapter.trainable.parameters()}
        inside, storages = [False], {}

        def pack(tensor):
            if inside[0] and id(tensor) not in parameters and id(tensor._base) not in parameters:
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        hooks = [block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
                 block.register_forward_hook(lambda *_: inside.__setitem__(0, False))]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            adapter.compute_loss(batch, torch.Generator().manual_seed(0))
        for hook in hooks:
            hook.remove()
        return sum(storages.values())


def profiler_benchmark():
    """benchmarks/bench_activation_profiler.py as a module (it imports benchlib beside it, as
    a script run from that folder does)."""
    folder = REPO / "benchmarks"
    spec = importlib.util.spec_from_file_location(
        "bench_activation_profiler", folder / "bench_activation_profiler.py")
    module = importlib.util.module_from_spec(spec)
    with mock.patch.object(sys, "path", [str(folder), *sys.path]):
        spec.loader.exec_module(module)
    return module


class ProfiledActivationTest(TinyModelCase):
    def test_the_profiler_sees_what_the_plan_counts(self):
        """The profiler sees only what the step allocates: Qwen-Image's RoPE tables, made
        when the model loads and saved for the backward, are added to its figure."""
        bench = profiler_benchmark()
        for family in ESTIMATED:
            with self.subTest(family=family):
                row = bench.compare(family, "lora")
                measured = row["at_backward"]
                if family == "qwen_image":
                    rope = self.load(family).transformer.pos_embed
                    measured += sum(t.untyped_storage().nbytes()
                                    for t in (rope.pos_freqs, rope.neg_freqs))
                assert_estimate_fits(self, family, row["estimate"], measured)
                self.assertGreaterEqual(row["peak"], row["at_backward"])


if __name__ == "__main__":
    unittest.main()
