"""The trained network on the meta device with the adapter a LoRA run adds (nothing read,
nothing allocated), which the memory plan counts; and whether that adapter fits the host at
all: peft and LyCORIS build its parameters on the host, in float32, before anything moves to a
device, so an adapter larger than the host's RAM was killed by the kernel without a word (a LoHa
with linear_dim 1e8). The preflight asks before the model loads."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.adapters.lora import LoraTargetError
from simpletuner.training.adapters.lycoris_adapter import LycorisTargetError


def network_class(adapter_class) -> type:
    from diffusers import UNet2DConditionModel
    return getattr(adapter_class, "transformer_class", UNet2DConditionModel)


class _ValuesOnHost(TorchFunctionMode):
    """torch.tensor(values) on the host inside the meta device's context: LyCORIS reads a
    convolution's kernel size through torch.tensor(kernel_size).prod().item(), which a meta
    tensor cannot answer; every other tensor stays on the meta device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.tensor and kwargs.get("device") is None:
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def meta_network(adapter_class, folder: Path, training) -> torch.nn.Module:
    """The trained network on the meta device, a LoRA added as the trainer adds it."""
    cls = network_class(adapter_class)
    with torch.device("meta"):
        network = cls.from_config(cls.load_config(folder / adapter_class.trainable_component))
        if training.model_type == "lora":
            with _ValuesOnHost():
                add_adapter(network, adapter_class, training)
    return network


def host_ram_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def adapter_ram_problem(adapter_class, folder: Path, training) -> str | None:
    """Why the adapter ``training`` (a LoRA run's TrainingConfig) asks for cannot be built on
    this host, if it cannot; a target that matches no module is left to the run, which names
    the modules there are."""
    try:
        network = meta_network(adapter_class, folder, training)
    except (LoraTargetError, LycorisTargetError):
        return None
    parameters = sum(p.numel() for p in network.parameters() if p.requires_grad)
    built, ram = parameters * torch.float32.itemsize, host_ram_bytes()
    if built <= ram:
        return None
    rank = "linear_dim in lycoris_config" if training.lora_type == "lycoris" else "lora_rank"
    return (f"the {training.lora_type} adapter has {parameters:,} parameters, "
            f"{built / 2**30:.1f} GiB in float32 as it is built on the host (before its "
            f"gradients and optimizer state), more than this machine's {ram / 2**30:.1f} GiB of "
            f"RAM; lower {rank}")
