"""Group offload of a frozen component through diffusers' own group-offloading hooks: its
weights stay on the host (or in a folder on disk) and each group of layers comes to the
onload device for its own forward only.

A diffusers model (the VAE) takes ``ModelMixin.enable_group_offload``, every part it enters
through encode() or decode() a block module. A transformers text encoder is no ModelMixin:
``apply_group_offloading`` is applied to it. At block level diffusers looks for repeated
layers among its direct children only, and transformers keeps them deeper (CLIP's and T5's
under ``encoder``, Qwen2.5-VL's under ``model.language_model``), so the encoder is one group,
on the device for its forward only; descending to those layers would leave parts a parent
uses before entering its child (Qwen2.5-VL's embedding) behind on the host. leaf_level
brings one layer at a time. A group-offloaded module is never
moved with ``.to()``: diffusers refuses that on its models, and on any other module it would
pull the weights from under the hooks. On disk, a group's tensors are empty placeholders
between its forwards; ``saved_weights_in_place`` puts the saved ones back for an export."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import safetensors.torch
import torch
from diffusers.hooks import apply_group_offloading
from diffusers.hooks.group_offloading import _GROUP_OFFLOADING, _is_group_offload_enabled
from diffusers.models.modeling_utils import ModelMixin

CPU = torch.device("cpu")


def is_group_offloaded(module: torch.nn.Module) -> bool:
    """Whether diffusers' group-offloading hooks hold ``module`` (its hook registry)."""
    return _is_group_offload_enabled(module)


def entry_children(model: ModelMixin) -> list[str]:
    """The block modules of a diffusers model: its own list, else every direct child holding
    tensors. A VAE is entered through encode() and decode(), never forward(), so a part left
    to the top-level group would never be brought to the device."""
    declared = getattr(model, "_group_offload_block_modules", None)
    if declared is not None:
        return list(declared)
    return [name for name, child in model.named_children()
            if next(child.parameters(), None) is not None
            or next(child.buffers(), None) is not None]


def untie_shared_parameters(module: torch.nn.Module) -> None:
    """Give every module its own copy of a parameter it shares with another (T5's tied input
    embedding). On disk, each group saves its tensors when it first offloads, then empties
    them: a shared weight would be saved by its second group already emptied. The module is
    frozen, so the copies never drift apart."""
    seen: set[int] = set()
    for child in module.modules():
        for name, parameter in list(child.named_parameters(recurse=False)):
            if id(parameter) in seen:
                setattr(child, name, torch.nn.Parameter(parameter.detach().clone(),
                                                        requires_grad=parameter.requires_grad))
            seen.add(id(parameter))


def offload_groups(module: torch.nn.Module, *, onload_device: torch.device, offload_type: str,
                   blocks_per_group: int, use_stream: bool, disk_folder: Path | None) -> None:
    """Install the hooks on ``module`` (it must be on the host). Streams are a CUDA feature:
    elsewhere the copies are plain ones, as SimpleTuner does."""
    arguments = {"onload_device": onload_device, "offload_device": CPU,
                 "offload_type": offload_type,
                 "use_stream": use_stream and onload_device.type == "cuda",
                 "offload_to_disk_path": None if disk_folder is None else str(disk_folder)}
    if offload_type == "block_level":
        arguments["num_blocks_per_group"] = blocks_per_group
    if isinstance(module, ModelMixin):
        if offload_type == "block_level":
            arguments["block_modules"] = entry_children(module)
        module.enable_group_offload(**arguments)
    else:
        apply_group_offloading(module, **arguments)


def _disk_groups(modules: list[torch.nn.Module]) -> list:
    """The distinct disk-offloaded groups of diffusers' hooks on ``modules``."""
    groups = {}
    for module in modules:
        for child in module.modules():
            registry = getattr(child, "_diffusers_hook", None)
            hook = None if registry is None else registry.get_hook(_GROUP_OFFLOADING)
            if hook is not None and hook.group.offload_to_disk_path is not None:
                groups[id(hook.group)] = hook.group
    return list(groups.values())


@contextmanager
def saved_weights_in_place(modules: list[torch.nn.Module]):
    """A context in which disk-offloaded ``modules`` hold their weights on the host (read back
    from their groups' files), e.g. while a pipeline is saved; placeholders again after."""
    groups = _disk_groups(modules)
    for group in groups:
        saved = safetensors.torch.load_file(group.safetensors_file_path, device="cpu")
        for key, tensor in group.key_to_tensor.items():
            tensor.data = saved[key]
    try:
        yield
    finally:
        for group in groups:
            for tensor in group.key_to_tensor.values():
                tensor.data = torch.empty_like(tensor.data, device=CPU)
