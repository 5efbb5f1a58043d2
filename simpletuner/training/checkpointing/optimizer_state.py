"""An optimizer state dict as safetensors-able tensors plus JSON-able values, and back, for every
optimizer of optimizers.py: plain tensors of any dtype (fp32, bf16, int8...), non-tensor state
(Prodigy's int step), hyper-parameters, and torchao's quantized states (tensor subclasses such
as OptimState8bit), which are stored as their inner tensors plus a JSON description.

Tensor keys: ``state/<param index>/<name>`` for a plain tensor,
``subclass/<param index>/<name>/<inner name>`` for a part of a quantized one,
``group/<group number>/<name>`` for a tensor among a param group's values."""

from __future__ import annotations

import importlib
from typing import Any

import torch

SUBCLASS_MARK = "__tensor_subclass__"
DTYPE_MARK = "__dtype__"
# Only these modules' tensor subclasses are rebuilt on load: the classes are named in JSON.
TRUSTED_SUBCLASS_MODULES = ("torchao.optim.",)


def _is_subclass_tensor(value: Any) -> bool:
    return type(value) is not torch.Tensor and hasattr(value, "__tensor_flatten__")


def _encode_context(value: Any) -> Any:
    """JSON for a subclass's flatten context: dtypes become {"__dtype__": name}."""
    if isinstance(value, torch.dtype):
        return {DTYPE_MARK: str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [_encode_context(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store {type(value).__name__} {value!r} of an optimizer state")


def _decode_context(value: Any) -> Any:
    if isinstance(value, dict):
        return getattr(torch, value[DTYPE_MARK])
    if isinstance(value, list):
        return [_decode_context(item) for item in value]
    return value


def _subclass(name: str) -> type:
    module, _, class_name = name.rpartition(".")
    if not module.startswith(TRUSTED_SUBCLASS_MODULES):
        raise ValueError(f"optimizer state names tensor class {name}, which is not one of "
                         f"{TRUSTED_SUBCLASS_MODULES}")
    return getattr(importlib.import_module(module), class_name)


def optimizer_to_files(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state dict into safetensors-able tensors and JSON-able values."""
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, dict[str, Any]] = {}
    for index, entries in state_dict["state"].items():
        for name, value in entries.items():
            if _is_subclass_tensor(value):
                parts, context = value.__tensor_flatten__()
                for part in parts:  # cloned: parts may share storage, which safetensors refuses
                    tensors[f"subclass/{index}/{name}/{part}"] = (
                        getattr(value, part).detach().contiguous().clone())
                kind = type(value)
                values.setdefault(str(index), {})[name] = {
                    SUBCLASS_MARK: f"{kind.__module__}.{kind.__qualname__}", "parts": parts,
                    "context": _encode_context(context), "shape": list(value.shape),
                    "stride": list(value.stride())}
            elif isinstance(value, torch.Tensor):
                tensors[f"state/{index}/{name}"] = value.detach().contiguous()
            else:
                values.setdefault(str(index), {})[name] = value
    groups = []
    for number, group in enumerate(state_dict["param_groups"]):
        for name, value in group.items():
            if isinstance(value, torch.Tensor):  # optimi's per-group step counter
                tensors[f"group/{number}/{name}"] = value.detach().contiguous()
        groups.append({k: v for k, v in group.items() if not isinstance(v, torch.Tensor)})
    return tensors, {"state": values, "param_groups": groups}


def _rebuild_subclass(description: dict, tensors: dict[str, torch.Tensor], prefix: str):
    parts = {part: tensors[f"{prefix}/{part}"] for part in description["parts"]}
    return _subclass(description[SUBCLASS_MARK]).__tensor_unflatten__(
        parts, _decode_context(description["context"]), torch.Size(description["shape"]),
        tuple(description["stride"]))


def optimizer_from_files(tensors: dict[str, torch.Tensor], values: dict) -> dict[str, Any]:
    """The inverse of optimizer_to_files; parameter indices become ints again."""
    state: dict[int, dict[str, Any]] = {}
    groups = [dict(group, betas=tuple(group["betas"])) if "betas" in group else dict(group)
              for group in values["param_groups"]]
    for key, tensor in tensors.items():
        kind, index, name = key.split("/", 2)
        if kind == "state":
            state.setdefault(int(index), {})[name] = tensor
        elif kind == "group":
            groups[int(index)][name] = tensor
    for index, entries in values["state"].items():
        for name, value in entries.items():
            if isinstance(value, dict) and SUBCLASS_MARK in value:
                value = _rebuild_subclass(value, tensors, f"subclass/{index}/{name}")
            state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": groups}
