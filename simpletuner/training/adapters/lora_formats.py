"""LoRA files in the layout each ecosystem loads (SimpleTuner's lora_format 'comfyui'): the
peft adapter's tensors renamed to the family's layout (lora_layouts.py), alpha as a tensor beside
each module, the rank in kohya's metadata keys."""

from __future__ import annotations

from pathlib import Path

import torch
from peft.utils import get_peft_model_state_dict

from simpletuner.families import family_spec
from simpletuner.training.adapters.adapter_file import write_adapter_file


def _modules(peft_state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """peft's ``<path>.lora_A.weight`` / ``.lora_B.weight`` pairs by module path."""
    pairs = {}
    for key in peft_state:
        if key.endswith(".lora_A.weight"):
            path = key[: -len(".lora_A.weight")]
            pairs[path] = (peft_state[key], peft_state[path + ".lora_B.weight"])
    return pairs


def _fuse(parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """One LoRA for a fused q/k/v projection from the LoRAs of its slots (0, 1, 2): downs
    stacked, ups block-diagonal, so each slot's rows give exactly its own update."""
    downs = [parts[slot][0] for slot in sorted(parts)]
    out = next(iter(parts.values()))[1].shape[0]
    up = torch.zeros(3 * out, sum(d.shape[0] for d in downs), dtype=downs[0].dtype)
    column = 0
    for slot in sorted(parts):
        down, slot_up = parts[slot]
        up[slot * out:(slot + 1) * out, column:column + down.shape[0]] = slot_up
        column += down.shape[0]
    return torch.cat(downs), up


def to_comfyui(family: str, peft_state: dict[str, torch.Tensor], *, rank: int,
               alpha: float) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The family's ComfyUI layout of a peft adapter state dict (keys without the component
    prefix, as get_peft_model_state_dict gives them): tensors and safetensors metadata."""
    layout = family_spec(family).comfyui_layout
    tensors, fused = {}, {}
    for path, (down, up) in _modules(peft_state).items():
        key, slot = layout.module_key(path), layout.fused_slot(path)
        if not layout.alpha_keys:
            up = up * (alpha / down.shape[0])  # the file's modules apply scale 1
        if slot is not None:
            fused.setdefault(key, {})[slot] = (down, up)
            continue
        tensors[key + layout.down], tensors[key + layout.up] = down, up
        if layout.alpha_keys:
            tensors[key + ".alpha"] = torch.tensor(float(alpha))
    for key, parts in fused.items():
        tensors[key + layout.down], tensors[key + layout.up] = _fuse(parts)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    metadata = {"ss_network_module": "networks.lora", "ss_network_dim": str(rank),
                "ss_network_alpha": f"{alpha:g}" if layout.alpha_keys else str(rank),
                "lora_format": "comfyui", "lora_layout": layout.name,
                "model_family": family}
    return tensors, metadata


def write_comfyui_lora(family: str, network: torch.nn.Module, path: Path) -> Path:
    """The network's "default" peft adapter in the family's ComfyUI layout at ``path``, with
    the tensor hash as kohya's scripts write it."""
    config = network.peft_config["default"]
    state = {k: v.detach() for k, v in get_peft_model_state_dict(network).items()}
    tensors, metadata = to_comfyui(family, state, rank=config.r, alpha=float(config.lora_alpha))
    return write_adapter_file(path, tensors, metadata)
