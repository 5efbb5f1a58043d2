"""init_lora (SimpleTuner's option): a fresh run's adapter starts from an existing file.

A LoRA file in any layout diffusers' load_lora_weights reads (this trainer's diffusers or
comfyui export, kohya's, ComfyUI's...) is put on the network by that very call, through the
family's pipeline, as a second adapter; its update is copied into the run's adapter ("default",
scaled so that B * alpha / rank is the file's), and the second adapter is removed. A LyCORIS
run loads a LyCORIS file (lycoris_<module> keys) into its own adapter."""

from __future__ import annotations

from pathlib import Path

import torch

from simpletuner.training.checkpointing.tensor_files import load_tensors
from simpletuner.training.adapters.lora import LoraTargetError, load_lora_file
from simpletuner.training.adapters.lycoris_adapter import load_lycoris_state, lycoris_of

LOADED = "init_lora"  # the adapter name load_lora_weights gives the file's LoRA


class LoraInitError(LoraTargetError):
    """init_lora's file does not fit the run's adapter."""


def init_adapter(adapter, path: Path) -> None:
    """Start ``adapter.trainable``'s adapter from the file at ``path``."""
    network, path = adapter.trainable, Path(path)
    if lycoris_of(network) is not None:
        try:
            load_lycoris_state(network, load_tensors(path), path)
        except ValueError as exc:
            raise LoraInitError(f"init_lora: {exc}") from None
        return
    pipeline = adapter.build_pipeline(network)
    if not (hasattr(pipeline, "load_lora_weights") or hasattr(network, "load_lora_adapter")):
        raise LoraInitError(f"init_lora: diffusers' {type(pipeline).__name__} has no LoRA "
                            "loader to read the file with; remove init_lora")
    try:
        load_lora_file(type(adapter), pipeline, path, adapter_name=LOADED)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise LoraInitError(f"init_lora {path} is not a LoRA file diffusers can put on the "
                            f"{adapter.family} network ({exc})") from None
    try:
        _copy_loaded(network, path)
    finally:
        network.delete_adapters(LOADED)
        network.set_adapter("default")
        for name, parameter in network.named_parameters():
            parameter.requires_grad_(".default." in name and "lora_" in name)


def _copy_loaded(network: torch.nn.Module, path: Path) -> None:
    layers = [(n, m) for n, m in network.named_modules() if hasattr(m, "lora_A")]
    ours = [n for n, m in layers if "default" in m.lora_A]
    loaded = [n for n, m in layers if LOADED in m.lora_A]
    if set(ours) != set(loaded):
        missing, extra = sorted(set(ours) - set(loaded)), sorted(set(loaded) - set(ours))
        raise LoraInitError(
            f"init_lora {path} adapts other modules than this run ({len(missing)} of the run's "
            f"not in it, e.g. {missing[:2]}; {len(extra)} others, e.g. {extra[:2]}); set "
            "lora_target_modules to the modules it adapts")
    with torch.no_grad():
        for name, layer in layers:
            down, up = layer.lora_A[LOADED].weight, layer.lora_B[LOADED].weight
            if down.shape != layer.lora_A["default"].weight.shape:
                raise LoraInitError(f"init_lora {path} has rank {down.shape[0]} at {name}; "
                                    f"this run's lora_rank is {layer.r['default']}: set "
                                    "lora_rank to the file's")
            scale = layer.scaling[LOADED] / layer.scaling["default"]
            layer.lora_A["default"].weight.copy_(down)
            layer.lora_B["default"].weight.copy_(up * scale)
