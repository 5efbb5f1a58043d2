"""Bytes of the state each optimizer of optimization/optimizers.py keeps, from the trained
parameters' shapes and dtypes and the optimizer's keyword arguments (optimizer_config
included: amsgrad, kahan_sum, block_size, betas, slice_p, min_8bit_size), as each
library allocates it on its first step. Under FSDP2 the state of a sharded parameter is built
on this rank's shard; scalar steps and per-group tensors are held by every rank.

tests/test_memory_plan.py compares these with the state tensors of a real step; bnb-adamw8bit
needs CUDA and is sized from bitsandbytes' source only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from simpletuner.training.memory.shards import WHOLE, RankPart

STEP = 4  # a float32 (torch, torchao) or int32 (optimi) step counter
FLOAT32 = 4
QMAP = 256 * FLOAT32  # an 8-bit state's code table


@dataclass(frozen=True)
class Trained:
    """One trained parameter as the optimizer gets it: its whole shape, its dtype after
    build_optimizer, whether it starts at zero (a LoRA's B), and which part this rank holds."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    starts_at_zero: bool = False
    part: RankPart = WHOLE

    @property
    def numel(self) -> int:
        return self.part.numel(self.shape)

    @property
    def bytes(self) -> int:
        return self.numel * self.dtype.itemsize


def _adamw(p: Trained, arguments: dict) -> int:
    moments = 3 if arguments.get("amsgrad") else 2
    return moments * p.bytes + STEP


def _adamw_bf16(p: Trained, arguments: dict) -> int:
    # optimi adds a Kahan compensation buffer for 16-bit parameters
    kahan = arguments.get("kahan_sum", True) is not False and p.dtype.itemsize == 2
    return (3 if kahan else 2) * p.bytes


def _ao_adamw8bit(p: Trained, arguments: dict) -> int:
    block = arguments.get("block_size", 256)
    local = p.numel  # torchao quantizes by the shard's size, 4096 values and up
    eight_bit = local >= 4096 and local % block == 0
    buffer = local + local // block * FLOAT32 + QMAP if eight_bit else p.bytes
    return (3 if arguments.get("amsgrad") else 2) * buffer + STEP


def _bnb_eight_bit(p: Trained, arguments: dict) -> bool:
    return p.numel >= arguments.get("min_8bit_size", 4096)  # AdamW8bit ignores optim_bits


def _bnb_adamw8bit(p: Trained, arguments: dict) -> int:
    # 8-bit codes and a float32 absmax per 256 values; the code tables are shared (group)
    if not _bnb_eight_bit(p, arguments):
        return 2 * p.numel * FLOAT32
    return 2 * (p.numel + math.ceil(p.numel / 256) * FLOAT32)


def _prodigy(p: Trained, arguments: dict) -> int:
    # s and p0 keep every slice_p-th value; p0 of an all-zero parameter is one number
    sliced = math.ceil(p.numel / arguments.get("slice_p", 1)) * p.dtype.itemsize
    p0 = p.dtype.itemsize if p.starts_at_zero else sliced
    moments = 2 if arguments.get("betas", (0.9, 0.999))[0] > 0 else 1
    return moments * p.bytes + sliced + p0


def _adafactor(p: Trained, arguments: dict) -> int:
    if len(p.shape) < 2:
        return p.bytes + STEP
    rows = p.shape[:-1] + (1,)  # a variance per row and per column, sharded like the weight
    columns = p.shape[:-2] + (1, p.shape[-1])
    return (p.part.numel(rows) + p.part.numel(columns)) * p.dtype.itemsize + STEP


def _lion(p: Trained, arguments: dict) -> int:
    return p.bytes


PER_PARAMETER: dict[str, Callable[[Trained, dict], int]] = {
    "adamw": _adamw, "adamw_bf16": _adamw_bf16, "ao-adamw8bit": _ao_adamw8bit,
    "bnb-adamw8bit": _bnb_adamw8bit, "prodigy": _prodigy, "adafactor": _adafactor,
    "lion": _lion,
}


def _per_group(optimizer: str, parameters: list[Trained], arguments: dict) -> int:
    """Tensors of the one parameter group build_optimizer makes."""
    if optimizer == "adamw_bf16":
        return STEP          # optimi's step
    if optimizer == "ao-adamw8bit":
        return FLOAT32       # torchao keeps the learning rate as a tensor
    if optimizer == "bnb-adamw8bit" and any(_bnb_eight_bit(p, arguments) for p in parameters):
        return 2 * QMAP      # the signed and unsigned code tables
    return 0


def optimizer_state_bytes(optimizer: str, parameters: list[Trained],
                          arguments: dict[str, Any]) -> int:
    """Bytes of ``optimizer``'s state over ``parameters`` on this rank after its first step."""
    per_parameter = PER_PARAMETER[optimizer]
    return (sum(per_parameter(p, arguments) for p in parameters)
            + _per_group(optimizer, parameters, arguments))
