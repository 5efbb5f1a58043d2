"""An exported adapter file (a LoRA in another layout, a LyCORIS file) as the tools around
ComfyUI read it: safetensors whose header also holds the hash of its tensor data
(``sshs_model_hash``, which kohya's scripts and LyCORIS record so that web UIs and model sites
need not hash the file themselves), written under a temporary name and renamed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from simpletuner.common.atomic import atomic_write_with, naming_path


def tensor_data_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 (hex) of the tensors' bytes in name order: for tensors of one dtype, what follows
    the header of their safetensors file (which orders them so), the "addnet" hash web UIs take
    of it. One tensor at a time, so a full-weight adapter is never serialised twice."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(tensors[name].detach().cpu().contiguous().reshape(-1)
                      .view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def write_adapter_file(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str],
                       *, hash_prefix: str = "") -> Path:
    """``tensors`` and ``metadata`` at ``path``, with sshs_model_hash (``hash_prefix`` before
    the hex: LyCORIS writes "0x", kohya's scripts nothing)."""
    tensors = {name: tensors[name].contiguous() for name in sorted(tensors)}
    metadata = {**metadata, "sshs_model_hash": hash_prefix + tensor_data_sha256(tensors)}
    with naming_path(path):  # a full disk is named, not only its errno
        atomic_write_with(path, lambda temporary: save_file(tensors, temporary, metadata))
    return path
