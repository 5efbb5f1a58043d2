"""Context parallel's sequence-parallel attention (Ulysses), through diffusers' own plan.

With ``context_parallel_size`` C the C ranks of a data-parallel group (helpers/metadata/mesh.py)
train the identical micro-batch. The trained transformer's ``_cp_plan`` (diffusers) splits its
token sequence at its input into C parts, one per rank; each attention exchanges heads for
sequence with one all-to-all (each rank attends over the whole sequence with H/C heads, then
the inverse all-to-all), and the output is gathered whole before the loss. So every rank of a
group computes the same loss, and the gradient each rank gets is its part's: summed over the C
ranks it is the micro-batch's gradient. The data-parallel reduction averages over all W
ranks, so the loss is scaled by C for the backward (``gradient_scale``): the average is then
the one over the D groups, and C changes nothing that is learned.

diffusers' ``enable_parallelism`` cannot be used as it is on the CPU (it picks a device by
``rank % device_count()``), so the same steps are taken here with the run's device.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from diffusers.hooks.context_parallel import (ModuleForwardMetadata, apply_context_parallel,
                                              remove_context_parallel)
from diffusers.models._modeling_parallel import (ContextParallelConfig, ContextParallelInput,
                                                 ParallelConfig)
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention
from torch.distributed.device_mesh import init_device_mesh

from simpletuner.helpers.metadata.mesh import Mesh


class ContextParallelError(ValueError):
    """The network cannot shard its sequence over context_parallel_size ranks."""


def heads_problem(heads: int, context_parallel: int) -> str | None:
    if heads % context_parallel == 0:
        return None
    return (f"context_parallel_size {context_parallel} does not divide the transformer's "
            f"{heads} attention heads: each rank of a context-parallel group attends with "
            f"heads / context_parallel_size of them; use a context_parallel_size that divides "
            f"{heads}")


def _processors(network: torch.nn.Module) -> list:
    return [module.processor for module in network.modules()
            if isinstance(module, (Attention, AttentionModuleMixin))
            and hasattr(getattr(module, "processor", None), "_parallel_config")]


def shard_sequence(network: torch.nn.Module, mesh: Mesh, rank: int,
                   device: torch.device) -> None:
    """Every rank calls it (the device mesh's groups are made collectively); ``network`` is
    the trained transformer, before DDP wraps it."""
    plan = getattr(type(network), "_cp_plan", None)
    heads = getattr(network.config, "num_attention_heads", None)
    if plan is None or heads is None:
        raise ContextParallelError(f"{type(network).__name__} has no context-parallel plan: "
                                   "set context_parallel_size to 1")
    problem = heads_problem(int(heads), mesh.context_parallel)
    if problem:
        raise ContextParallelError(problem)
    device_mesh = init_device_mesh(device.type, (mesh.data_parallel, 1, mesh.context_parallel),
                                   mesh_dim_names=("dp", "ring", "ulysses"))
    config = ParallelConfig(context_parallel_config=ContextParallelConfig(
        ulysses_degree=mesh.context_parallel))
    config.setup(rank, mesh.processes, device, mesh=device_mesh)
    network._parallel_config = config
    for processor in _processors(network):
        processor._parallel_config = config
    apply_context_parallel(network, config.context_parallel_config, plan)
    _check_sequences(network, plan, mesh.context_parallel)


def sequence_problem(planned: dict, module_class: type, args: tuple, kwargs: dict,
                     context_parallel: int) -> str | None:
    """Which input the plan splits (``planned``: one module's entry) does not split into
    ``context_parallel`` equal parts, and its length; None when all do."""
    found = ModuleForwardMetadata(_cls=module_class)
    for name, split in planned.items():
        if not isinstance(split, ContextParallelInput) or split.split_output:
            continue
        value = found._get_parameter_from_args_kwargs(name, list(args), kwargs)[0]
        if (torch.is_tensor(value)
                and split.expected_dims in (None, value.dim())
                and value.shape[split.split_dim] % context_parallel):
            return f"{name} holds {value.shape[split.split_dim]}"
    return None


def _check_sequences(network: torch.nn.Module, plan: dict, context_parallel: int) -> None:
    """Before diffusers' hooks split an input: a clear error, the same on every rank (they
    train one bucket at a time), instead of its assertion. Off with the plan's hooks."""
    for module_id, planned in plan.items():
        if not isinstance(planned, dict):
            continue
        module = network.get_submodule(module_id)

        def check(module, args, kwargs, planned=planned, where=module_id or "its input"):
            if getattr(network, "_parallel_config", None) is None:  # sequence_whole
                return
            problem = sequence_problem(planned, type(module), args, kwargs, context_parallel)
            if problem:
                raise ContextParallelError(
                    f"context parallel: {problem} tokens at {where} of "
                    f"{type(network).__name__}, which do not split into context_parallel_size "
                    f"{context_parallel} equal parts; train buckets whose token counts do (a "
                    "larger aspect_bucket_alignment, e.g. 64) or use a context_parallel_size "
                    "that divides them")

        module.register_forward_pre_hook(check, with_kwargs=True)


def gradient_scale(network: torch.nn.Module) -> int:
    """C for a network whose sequence is sharded (see the module's docstring), else 1."""
    config = getattr(network, "_parallel_config", None)
    cp = None if config is None else config.context_parallel_config
    return 1 if cp is None else cp.ulysses_degree


@contextmanager
def sequence_whole(network: torch.nn.Module) -> Iterator[None]:
    """The network as one rank runs it alone (validation on the main rank): its plan's hooks
    and the processors' config taken off, and put back after."""
    config = getattr(network, "_parallel_config", None)
    if config is None:
        yield
        return
    plan = type(network)._cp_plan
    remove_context_parallel(network, plan)
    processors = _processors(network)
    for processor in processors:
        processor._parallel_config = None
    network._parallel_config = None
    try:
        yield
    finally:
        network._parallel_config = config
        for processor in processors:
            processor._parallel_config = config
        apply_context_parallel(network, config.context_parallel_config, plan)
