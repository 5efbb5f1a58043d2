"""The tensors of a checkpoint without pickles: trained weights and optimizer state as
safetensors, the optimizer's plain values and each rank's RNG states as JSON.

A full run saves the network's state dict (``model.safetensors``); a LoRA run only the adapter
(``lora_adapter.safetensors``). The optimizer's per-parameter tensors go to
``optimizer.safetensors`` and everything else in its state dict (hyper-parameters, param-group
layout, non-tensor state) to ``optimizer.json`` (see optimizer_state.py).

Every tensor file is refused when non-finite on save and on load (tensor_files), and every
failure names its file (a CheckpointError).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simpletuner.common.atomic import atomic_write_json
from simpletuner.training.checkpointing.manifest import naming_file
from simpletuner.training.checkpointing.optimizer_state import optimizer_from_files, optimizer_to_files
from simpletuner.training.checkpointing.tensor_files import load_tensors, save_tensors

FULL_WEIGHTS = "model.safetensors"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_VALUES = "optimizer.json"


def _adapter_files():
    """The LoRA adapter's checkpoint file, imported where a LoRA is saved or loaded: the adapter
    module brings peft and transformers, which took more than half the start-up of a process
    that only checkpoints a full network."""
    from simpletuner.training.adapters import lora

    return lora


def weights_file(lora: bool) -> str:
    return _adapter_files().CHECKPOINT_WEIGHTS if lora else FULL_WEIGHTS


def save_weights(network: torch.nn.Module, folder: Path, lora: bool) -> None:
    if lora:
        adapter = _adapter_files()
        adapter.save_adapter_weights(network, folder / adapter.CHECKPOINT_WEIGHTS)
    else:
        save_tensors(network.state_dict(), folder / FULL_WEIGHTS)


def load_weights(network: torch.nn.Module, folder: Path, lora: bool) -> None:
    if lora:
        adapter = _adapter_files()
        path = folder / adapter.CHECKPOINT_WEIGHTS
        with naming_file(path, "read"):
            adapter.load_adapter_weights(network, path)
    else:
        path = folder / FULL_WEIGHTS
        tensors = load_tensors(path)
        with naming_file(path, "load"):
            network.load_state_dict(tensors, strict=True)


def save_optimizer(optimizer, folder: Path) -> None:
    tensors, values = optimizer_to_files(optimizer.state_dict())
    save_tensors(tensors, folder / OPTIMIZER_TENSORS)
    with naming_file(folder / OPTIMIZER_VALUES, "write"):
        atomic_write_json(folder / OPTIMIZER_VALUES, values)


def load_optimizer(optimizer, folder: Path) -> None:
    with naming_file(folder / OPTIMIZER_VALUES, "read"):
        values = json.loads((folder / OPTIMIZER_VALUES).read_text(encoding="utf-8"))
    tensors = load_tensors(folder / OPTIMIZER_TENSORS)
    with naming_file(folder / OPTIMIZER_TENSORS, "load"):
        optimizer.load_state_dict(optimizer_from_files(tensors, values))


def rng_file(rank: int) -> str:
    return f"rng-{rank}.json"


def capture_rng() -> dict[str, Any]:
    """This process's RNG states (dropout and peft draw from torch's global RNG)."""
    version, mt_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(mt_state), gauss],
             "numpy": [kind, keys.tolist(), position, has_gauss, cached],
             "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
