"""The tensors of an FSDP2 checkpoint, inside the same staged `checkpoint-<step>/` folder.

SHARDED_STATE_DICT: `torch.distributed.checkpoint` with its safetensors storage: every rank
writes its own `shard-<rank+1>-model-00001-of-00001.safetensors` holding its shard of the
weights (``model.*``, the adapter only for LoRA), the optimizer state (``optimizer.state.*``)
and the EMA (``ema.*``); where each shard sits in the whole is JSON in the file's safetensors
header. DCP's default storage is not used: its `.metadata` file is a pickle. The optimizer's
param groups (plain values) are JSON, written by the main rank.

FULL_STATE_DICT: the same tensors gathered, one at a time to the main rank's CPU, into
`model.safetensors`, `optimizer.safetensors` and `ema.safetensors`; each rank reads them back
and keeps its shard.

Nothing non-finite is written or resumed (tensor_files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.tensor import DTensor, distribute_tensor

from simpletuner.common.atomic import atomic_write_json
from simpletuner.training.checkpointing.manifest import CheckpointError, naming_file
from simpletuner.training.memory.sharding import local, whole
from simpletuner.training.checkpointing.tensor_files import first_non_finite, load_tensors, save_tensors

OPTIMIZER_GROUPS = "optimizer.json"
SHARD_PATTERN = "shard-*.safetensors"
FULL_FILES = {"model": "model.safetensors", "optimizer": "optimizer.safetensors",
              "ema": "ema.safetensors"}


def shard_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(SHARD_PATTERN))


def _options(lora: bool, **extra) -> StateDictOptions:
    # A LoRA checkpoint holds the adapter only, as without sharding.
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora, **extra)


def _live_state(network, optimizer, ema, lora: bool) -> tuple[dict[str, Any], list[dict]]:
    """The tensors to save or load into ({"model", "optimizer", "ema"}, each a flat dict of
    DTensor shards or replicated tensors) and the optimizer's param groups."""
    optimizer_state = get_optimizer_state_dict(network, optimizer)
    state = {"model": get_model_state_dict(network, options=_options(lora)),
             "optimizer": _flatten_optimizer(optimizer_state["state"])}
    if ema is not None:
        state["ema"] = ema.shadow
    return state, optimizer_state["param_groups"]


def _flatten_optimizer(state: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {f"{fqn}/{name}": value for fqn, entries in state.items()
            for name, value in entries.items()}


def _nest_optimizer(flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in flat.items():
        fqn, name = key.rsplit("/", 1)
        state.setdefault(fqn, {})[name] = value
    return state


def _refuse_non_finite(state: dict[str, dict[str, torch.Tensor]], where: Path) -> None:
    for part, tensors in state.items():
        bad = first_non_finite({name: local(t) for name, t in tensors.items()})
        if bad is not None:
            raise CheckpointError(f"{where}: {part} tensor '{bad}' holds NaN or infinite values "
                                  "on this rank; nothing non-finite is checkpointed or resumed")


def save_sharded(folder: Path, *, network, optimizer, ema, lora: bool, main: bool,
                 full: bool) -> None:
    """Every rank calls this (collectives inside; a DCP failure is raised on every rank)."""
    state, groups = _live_state(network, optimizer, ema, lora)
    _refuse_non_finite(state, folder)
    if full:
        _save_full(folder, state, main)
    else:
        with naming_file(folder, "write the shards into"):
            dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(folder),
                                                                    save_distributed=True))
    if main:
        with naming_file(folder / OPTIMIZER_GROUPS, "write"):
            atomic_write_json(folder / OPTIMIZER_GROUPS, {"param_groups": groups})


def _save_full(folder: Path, state: dict[str, dict[str, torch.Tensor]], main: bool) -> None:
    for part, tensors in state.items():
        gathered = {}
        for name, tensor in tensors.items():  # one whole tensor at a time on the device
            value = whole(tensor)
            if main:
                gathered[name] = value.detach().cpu()
        if main:
            save_tensors(gathered, folder / FULL_FILES[part])


def load_sharded(folder: Path, *, network, optimizer, ema, lora: bool) -> None:
    """Every rank calls this: restore its shards from either layout, whatever it was saved
    with (a checkpoint of another world size is unsupported, see AGENTS.md)."""
    state, _ = _live_state(network, optimizer, ema, lora)
    if shard_files(folder):
        with naming_file(folder, "read the shards in"):
            dcp.load(state, storage_reader=HuggingFaceStorageReader(str(folder)))
    else:
        _load_full(folder, state)
    _refuse_non_finite(state, folder)
    with naming_file(folder / OPTIMIZER_GROUPS, "read"):
        groups = json.loads((folder / OPTIMIZER_GROUPS).read_text(encoding="utf-8"))
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g
              for g in groups["param_groups"]]
    with naming_file(folder, "load the model and optimizer state from"):
        set_model_state_dict(network, state["model"], options=_options(lora))
        set_optimizer_state_dict(network, optimizer, {
            "state": _nest_optimizer(state["optimizer"]), "param_groups": groups})


def _load_full(folder: Path, state: dict[str, dict[str, torch.Tensor]]) -> None:
    for part, tensors in state.items():
        path = folder / FULL_FILES[part]
        loaded = load_tensors(path)
        missing = set(tensors) - set(loaded)
        if missing:
            raise CheckpointError(f"{path} lacks {len(missing)} tensors (e.g. "
                                  f"{sorted(missing)[0]}); was it saved for another model?")
        for name, live in tensors.items():
            with torch.no_grad():
                local(live).copy_(local(_like(loaded[name], live)))


def _like(full: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """``full`` laid out as ``live``: this rank's shard of it when ``live`` is a DTensor."""
    if isinstance(live, DTensor):
        return distribute_tensor(full.to(live.device, live.dtype), live.device_mesh,
                                 live.placements, src_data_rank=None)
    return full.to(live.device, live.dtype)
