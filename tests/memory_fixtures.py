"""Sets a built-in tiny model up as recipe.py does for a config (load, quantize, LoRA, caches,
frozen parts released, FSDP2, optimizer, EMA), runs one real step, and sums the bytes of the
real tensors at the two moments the memory model plans: while the caches are built and after
the step. Used by tests/test_memory_plan.py in process and, sharded, by
tests/memory_measure_runner.py under torchrun."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from simpletuner.configuration.options import TrainingConfig
from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import resolve_model_path
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.ema import EMAWeights
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.offload import release_frozen_components
from simpletuner.training.memory.quantization import quantize_frozen_weights
from simpletuner.training.memory.sharding import shard_network
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.preflight import weight_dtype
from simpletuner.training.settings import (OffloadSettings, OptimizerSettings,
                                          PrecisionSettings, ShardingSettings)
from torch.distributed.tensor import DTensor

from model_fixtures import random_batch


def case_config(case: dict) -> TrainingConfig:
    """The TrainingConfig of one grid case: a dict of option values and ``family``."""
    options = {"lora_rank": 4, **{k: v for k, v in case.items() if k != "family"}}
    return TrainingConfig(model_family=case["family"], output_dir="unused",
                          pretrained_model_name_or_path=f"builtin:tiny-{case['family']}",
                          data_backend_config="unused", **options)


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Storage of this rank's tensor: a DTensor's local shard, a quantized or 8-bit tensor by
    the plain tensors it is made of; nothing for a tensor on the meta device."""
    if isinstance(tensor, DTensor):
        return tensor_bytes(tensor.to_local())
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(
            tensor, "__tensor_flatten__"):
        parts, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, part)) for part in parts)
    return 0 if tensor.is_meta else tensor.numel() * tensor.element_size()


def _unique_bytes(tensors) -> int:
    """Each tensor once (bitsandbytes shares its code tables between parameters)."""
    return sum(tensor_bytes(t) for t in {id(t): t for t in tensors}.values())


def module_bytes(modules) -> int:
    return sum(_unique_bytes([*m.parameters(), *m.buffers()]) for m in modules)


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Every tensor in the optimizer's per-parameter state and in its parameter groups."""
    state = [v for entries in optimizer.state.values() for v in entries.values()]
    groups = [v for group in optimizer.param_groups for k, v in group.items() if k != "params"]
    return _unique_bytes(t for t in state + groups if isinstance(t, torch.Tensor))


def _autocast(training: TrainingConfig):
    if training.mixed_precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext()


def measure(case: dict, sharded: bool = False, step: bool = True) -> dict[str, int]:
    """Bytes held at each moment, by part, for the config of ``case``; without ``step``,
    only while the caches are built."""
    training = case_config(case)
    dtype = weight_dtype(training.mixed_precision)
    adapter_class = get_adapter_class(training.model_family)
    adapter = adapter_class.load(resolve_model_path(training.pretrained_model_name_or_path),
                                 device=torch.device("cpu"), weight_dtype=dtype,
                                 loss_settings=LossSettings())
    quantize_frozen_weights(adapter, PrecisionSettings.from_config(training), dtype)
    network = adapter.trainable
    if training.model_type == "lora":
        add_adapter(network, adapter_class, training)
    caching = module_bytes([network, adapter.vae, *adapter.text_encoders])
    if not step:
        return {"while_caching": caching}
    batch = random_batch(adapter, 1)  # what the caches would hold
    release_frozen_components(adapter, OffloadSettings.from_config(training), dtype)  # "free"
    if sharded:
        shard_network(network, ShardingSettings.from_config(training), "cpu")
    optimizer = build_optimizer(network, OptimizerSettings.from_config(training))
    ema = EMAWeights.for_run(network, training) if training.use_ema else None
    with _autocast(training):
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(0))
    loss.backward()
    # The same state as the compiled step (torchao compiles one per shape: minutes here).
    with torch.compiler.set_stance("force_eager"):
        optimizer.step()
    trainable = [p for p in network.parameters() if p.requires_grad]
    frozen = [p for p in network.parameters() if not p.requires_grad]
    held = {"trainable": _unique_bytes(trainable),
            "frozen": _unique_bytes([*frozen, *network.buffers()]),
            "gradients": _unique_bytes(p.grad for p in trainable),
            "optimizer": optimizer_bytes(optimizer),
            "ema": _unique_bytes(ema.shadow.values()) if ema else 0,
            "components": module_bytes([adapter.vae, *adapter.text_encoders])}
    return {**held, "while_caching": caching, "while_training": sum(held.values())}
