"""Checkpoint tensors as safetensors files: written atomically and flushed to disk, never with
a non-finite value, and read back only when every value is finite."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from simpletuner.common.atomic import atomic_write_with
from simpletuner.training.checkpointing.manifest import CheckpointError, naming_file


def first_non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN or infinity, else None."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def save_tensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Refuse non-finite values (a NaN saved is a run lost), then write under a temporary name,
    flush and rename. Any failure is a CheckpointError naming ``path``."""
    bad = first_non_finite(tensors)
    if bad is not None:
        raise CheckpointError(f"refusing to write {path}: tensor '{bad}' holds NaN or infinite "
                              "values; nothing non-finite is checkpointed")
    contiguous = {name: t.detach().contiguous() for name, t in tensors.items()}
    with naming_file(path, "write"):
        atomic_write_with(path, lambda temporary: save_file(contiguous, temporary))


def check_finite(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    bad = first_non_finite(tensors)
    if bad is not None:
        raise CheckpointError(f"{path}: tensor '{bad}' holds NaN or infinite values; this "
                              "checkpoint cannot be resumed, use an earlier one")


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; a missing, damaged or non-finite one is a CheckpointError."""
    with naming_file(path, "read"):
        tensors = load_file(str(path))
    check_finite(tensors, path)
    return tensors
