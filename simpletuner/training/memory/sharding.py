"""Sharded training with FSDP2: `torch.distributed.fsdp.fully_shard` applied in our own set-up,
per repeated block and then the root (as torchtitan and torchtune do), so the same code runs on
CPU/gloo and on GPUs/NCCL. (accelerate's FSDP plugin silently becomes DDP on MULTI_CPU.)

FSDP2 is data parallel: the split, the sampler and the trace see the world size as with DDP.
Each rank keeps 1/W of every parameter, its gradient and its optimizer state; a block's full
parameters exist only while it runs. Parameters stay float32; with mixed_precision 'bf16' the
gathered copies are bfloat16 and gradients are reduced in float32.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from simpletuner.common.peer_watch import in_collective
from simpletuner.training.adapters.lora import inject_lora
from simpletuner.training.adapters.lycoris_adapter import add_same_lycoris
from simpletuner.training.settings import ShardingSettings
from simpletuner.training.optimization.optimizers import cast_trainable


class ShardingError(ValueError):
    """An fsdp_* option that does not fit this network or this launch."""


def is_sharded(network: torch.nn.Module) -> bool:
    return isinstance(network, FSDPModule)


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def repeated_blocks(network: torch.nn.Module) -> list[torch.nn.Module]:
    """The network's repeated blocks, found from its structure: the items of its top-level
    ModuleLists (UNet down/up blocks, SD3/Flux transformer blocks), and any top-level child
    whose class is defined beside theirs (the UNet mid block)."""
    listed = [item for child in network.children() if isinstance(child, torch.nn.ModuleList)
              for item in child if _has_parameters(item)]
    homes = {type(block).__module__ for block in listed}
    beside = [child for child in network.children()
              if not isinstance(child, torch.nn.ModuleList) and type(child).__module__ in homes
              and _has_parameters(child)]
    return listed + beside


def named_blocks(network: torch.nn.Module, class_names: list[str]) -> list[torch.nn.Module]:
    """Every module of a class named in ``class_names``, innermost first (fully_shard goes
    bottom-up). A name that matches nothing is an error listing the block classes there are."""
    found = [m for _, m in network.named_modules() if type(m).__name__ in class_names]
    missing = set(class_names) - {type(m).__name__ for m in found}
    if missing:
        present = sorted({type(m).__name__ for m in repeated_blocks(network)})
        raise ShardingError(f"fsdp_transformer_layer_cls_to_wrap names {sorted(missing)}, which "
                            f"{type(network).__name__} does not have; its repeated blocks are "
                            f"{present}. Leave the option unset to shard those")
    return list(reversed(found))


def device_mesh(sharding: str, device_type: str) -> DeviceMesh:
    """1-D over every rank ("full"), or 2-D (replicate across nodes, shard within a node)."""
    world = torch.distributed.get_world_size()
    if sharding == "full":
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = world // per_node
    if nodes < 2 or nodes * per_node != world:
        raise ShardingError(f"fsdp_sharding 'hybrid' shards within a node and replicates across "
                            f"nodes, but this launch has {world} processes, {per_node} per node; "
                            "use fsdp_sharding 'full' on one node")
    return init_device_mesh(device_type, (nodes, per_node),
                            mesh_dim_names=("replicate", "shard"))


def precision_policy(mixed_precision: str) -> MixedPrecisionPolicy:
    if mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_network(network: torch.nn.Module, settings: ShardingSettings, device_type: str) -> None:
    """Shard ``network`` in place: each block, then the root (which holds what is left).
    Call before the optimizer is built: its parameters must be the shards."""
    classes = settings.fsdp_transformer_layer_cls_to_wrap
    blocks = named_blocks(network, classes) if classes else repeated_blocks(network)
    # FSDP2 fixes each parameter's dtype when it shards: a later cast would leave gradients
    # in the old dtype, which the optimizer refuses.
    cast_trainable(network, settings.optimizer)
    _take_main_ranks_values(network)
    placement = {"mesh": device_mesh(settings.fsdp_sharding, device_type),
                 "mp_policy": precision_policy(settings.mixed_precision)}
    for block in blocks:
        fully_shard(block, reshard_after_forward=settings.fsdp_reshard_after_forward, **placement)
    # The root's parameters are gathered for the whole forward and backward anyway.
    fully_shard(network, reshard_after_forward=False, **placement)


@torch.no_grad()
def _take_main_ranks_values(network: torch.nn.Module) -> None:
    """Every rank starts from the main rank's parameters and buffers, as DDP does: fully_shard
    keeps each rank's own slice, and randomly initialised ones (a LoRA's A) differ by rank."""
    with in_collective("the main rank's parameters for the sharded network"):
        for tensor in [*network.parameters(), *network.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)


def prepare(accelerator, network: torch.nn.Module, optimizer):
    """(the module to call, the optimizer): a sharded network is used as it is, since
    accelerate would wrap it in DDP; otherwise accelerate prepares both (DDP). The network is
    already placed (block swap keeps some blocks on the host): accelerate does not move it."""
    if is_sharded(network):
        return network, accelerator.prepare(optimizer)
    return accelerator.prepare(network, optimizer, device_placement=[False, True])


def accumulating(accelerator, network: torch.nn.Module, sync: bool):
    """The context of one micro-batch: gradients are reduced only on the last one of a step."""
    if sync:
        return nullcontext()
    if is_sharded(network):
        return _gradient_sync_off(network)
    return accelerator.no_sync(network)


@contextmanager
def _gradient_sync_off(network: FSDPModule) -> Iterator[None]:
    network.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        network.set_requires_gradient_sync(True)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective); any other tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gathered_state_dict(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every rank calls this; the main rank gets the full state dict on the CPU (gathered one
    tensor at a time), the others an empty dict."""
    return get_model_state_dict(network, options=StateDictOptions(full_state_dict=True,
                                                                  cpu_offload=True))


def _unsharded_class(network: torch.nn.Module) -> type:
    """fully_shard swaps a module's class for FSDP<Class>(FSDPModule, Class)."""
    return next(c for c in type(network).__mro__[1:]
                if not issubclass(c, FSDPModule)) if is_sharded(network) else type(network)


def unsharded_copy(network: torch.nn.Module, state_dict: dict[str, torch.Tensor]
                   ) -> torch.nn.Module:
    """A plain CPU module of the network's class holding ``state_dict`` (from
    gathered_state_dict), for the export and validation; built on the meta device, so no
    memory is spent on weights that would be overwritten."""
    with torch.device("meta"):
        copy = _unsharded_class(network).from_config(network.config)
        if getattr(network, "peft_config", None):
            inject_lora(copy, network.peft_config["default"])
        add_same_lycoris(network, copy)
    copy.load_state_dict(state_dict, strict=True, assign=True)
    for name, module in copy.named_modules():  # buffers outside the state dict: not sharded
        source = network.get_submodule(name)
        for key, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_meta:
                module._buffers[key] = source._buffers[key].detach().cpu().clone()
    return copy.eval()


def network_on_main(accelerator, prepared: torch.nn.Module) -> torch.nn.Module | None:
    """The trained network as one plain module on the main rank (None elsewhere), for the
    export and validation. Every rank calls this: a sharded network is gathered (to the CPU)."""
    if not is_sharded(prepared):
        return accelerator.unwrap_model(prepared) if accelerator.is_main_process else None
    with in_collective("gathering the sharded network on the main rank"):
        state_dict = gathered_state_dict(prepared)
    return unsharded_copy(prepared, state_dict) if accelerator.is_main_process else None
