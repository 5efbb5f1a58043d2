"""Bytes of frozen weights as each library stores them: float weights in their dtype, and the
quantized ones of quantization.py's precisions (torchao, optimum-quanto, bitsandbytes), from
shapes alone, so a network on the meta device can be sized.

The layouts are those of the libraries this project pins; tests/test_memory_plan.py compares
them with the tensors quantization.py really creates (int8/int4, on the CPU)."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from simpletuner.training.memory.quantization import nf4_linears
from simpletuner.training.memory.shards import WHOLE, RankPart

QUANTO_GROUP = 128  # optimum-quanto's largest int4 group size along the input features


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def quanto_group_size(inputs: int) -> int | None:
    """optimum-quanto's int4 group size for rows of ``inputs`` values (QModuleMixin): 128, or
    less by steps of 32 down to 32 until it divides the row; None (one group per row) when the
    row is no longer than 128 or nothing divides it."""
    if inputs <= QUANTO_GROUP:
        return None
    group = QUANTO_GROUP
    while inputs % group and group > 32:
        group -= 32
    return group if inputs % group == 0 else None


def quantized_weight_bytes(precision: str, shape: torch.Size, float_bytes: int) -> int:
    """Bytes of one quantized weight of ``shape``; ``float_bytes`` is the compute dtype's size,
    in which optimum-quanto keeps its scales."""
    out, numel = shape[0], math.prod(shape)
    if precision == "int8-torchao":   # int8 data, float32 scale and int8 zero point per row
        return numel + out * 4 + out
    if precision == "int8-quanto":    # int8 data, a scale per output row in the float dtype
        return numel + out * float_bytes
    if precision == "int4-quanto":    # two per byte; scale and shift per group of inputs
        group = quanto_group_size(numel // out)
        groups = numel // group if group else out
        return numel // 2 + 2 * groups * float_bytes
    if precision == "fp8-torchao":    # float8 data, float32 scale per row
        return numel + out * 4
    if precision == "nf4-bnb":        # two per byte; int8 absmax per 64, float32 per 256 of those
        return numel // 2 + numel // 64 + math.ceil(numel / 64 / 256) * 4
    raise ValueError(precision)


def quantized_modules(module: torch.nn.Module, precision: str) -> list[torch.nn.Module]:
    """The submodules whose frozen weight ``precision`` replaces: every Linear (quanto: and
    Conv2d; nf4: but what the model keeps in float32); trainable ones (a LoRA's own layers)
    are not."""
    if precision == "no_change":
        return []
    if precision == "nf4-bnb":
        return [m for _, _, m in nf4_linears(module) if not m.weight.requires_grad]
    kinds = ((torch.nn.Linear, torch.nn.Conv2d) if precision.endswith("quanto")
             else (torch.nn.Linear,))
    return [m for m in module.modules()
            if isinstance(m, kinds) and not m.weight.requires_grad]


def frozen_bytes(module: torch.nn.Module, precision: str, float_dtype: torch.dtype,
                 part: RankPart = WHOLE) -> dict[str, int]:
    """{storage: bytes} of ``module``'s frozen parameters and its buffers, after it is cast to
    ``float_dtype`` and quantized as ``precision``; storage is a dtype name or the precision.
    ``part``: the share of each parameter this rank holds (buffers are never sharded)."""
    float_bytes = float_dtype.itemsize
    quantized = {id(m.weight) for m in quantized_modules(module, precision)}
    if quantized and part.sharded:
        raise ValueError(f"{precision} weights are not sharded")
    held: dict[str, int] = defaultdict(int)
    for parameter in module.parameters():
        if parameter.requires_grad:
            continue
        if id(parameter) in quantized:
            held[precision] += quantized_weight_bytes(precision, parameter.shape, float_bytes)
        else:
            held[dtype_name(float_dtype)] += part.numel(tuple(parameter.shape)) * float_bytes
    if precision.endswith("quanto"):  # each quantized module's input and output scale buffers
        held[precision] += len(quantized) * 2 * float_bytes
    for buffer in module.buffers():
        dtype = float_dtype if buffer.is_floating_point() else buffer.dtype
        held[dtype_name(dtype)] += buffer.numel() * dtype.itemsize
    return dict(held)
