"""`python -m simpletuner plan --memory [--num-processes N] [--gpu-memory GIB]`: the memory
model's bytes per rank (model.py) under DDP and under FSDP2 at N processes, printed as a table,
then the device's peak with one micro-batch's activations (activations.py) and block swap, and
with --gpu-memory whether that fits and what would make it fit (fitting.py); from the config
and the model folder's configs and tokenizers only (no weight is read)."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace

from simpletuner.helpers.metadata.mesh import mesh_problem
from simpletuner.training.memory.device_report import byte_size, device_report
from simpletuner.training.memory.model import MemoryPlan, RankBytes, memory_plan
from simpletuner.training.run.adapter_checks import read_lycoris_config

NOT_COUNTED = ("Not counted above: activations (below), FSDP2's gathered blocks while they run, "
               "DDP's gradient buckets (up to one more copy of the gradients), the CUDA context "
               "and allocator overhead.")


def _by_storage(held: dict[str, int]) -> str:
    """The total and what it is stored as, largest first; parts under 1 % are left out."""
    total = sum(held.values())
    kinds = [k for v, k in sorted(((v, k) for k, v in held.items()), reverse=True)
             if v > total / 100]
    return f"{byte_size(total)} {' + '.join(kinds)}".rstrip()


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.2f} B" if parameters >= 1e8 else f"{parameters / 1e6:.2f} M"


def _rows(held: RankBytes, training) -> list[tuple[str, str]]:
    """(label, cell) for one column; labels are the same for every column."""
    away = ("group offload" if training.enable_group_offload
            else training.frozen_components_after_caching)
    components = (_by_storage(held.frozen_components) if held.components_stay
                  else "off the device")
    caching = (f"  VAE + text encoders (group offload: {training.group_offload_type})"
               if training.enable_group_offload else "  VAE + text encoders")
    # Wan 2.2 A14B's other expert; a row only where there is one (the same in every column).
    others = ([("  other networks (frozen)", _by_storage(held.other_networks))]
              if held.other_networks else [])
    return [
        ("while the caches are built", ""),
        ("  network (not yet sharded)", _by_storage(held.network_while_caching)),
        (caching, _by_storage(held.frozen_components)),
        *others,
        ("  total", byte_size(held.while_caching)),
        ("while training", ""),
        ("  trainable parameters", _by_storage(held.trainable)),
        ("  frozen network", _by_storage(held.frozen)),
        ("  gradients", byte_size(held.gradients)),
        (f"  optimizer state ({training.optimizer})", byte_size(held.optimizer)),
        ("  EMA (float32)", byte_size(held.ema)),
        (f"  VAE + text encoders ({away})", components),
        *others,
        ("  total", byte_size(held.while_training)),
        ("peak per rank", byte_size(held.peak)),
    ]


def _adapter(training) -> str:
    if training.lora_type == "lycoris":
        config = read_lycoris_config(training.lycoris_config)
        return f"LyCORIS {config['algo']} linear_dim {config.get('linear_dim', 4)}"
    return f"LoRA rank {training.lora_rank}"


def _heading(training, world: int, plan: MemoryPlan) -> list[str]:
    mode = (f"{_adapter(training)}, base {training.base_model_precision}"
            if training.model_type == "lora" else "full fine-tune")
    processes = f"{world} process" + ("es" if world > 1 else "")
    return [f"memory per rank at {processes}: {training.model_family}, {mode}, "
            f"mixed_precision {training.mixed_precision}, optimizer {training.optimizer}, "
            f"EMA {'on' if training.use_ema else 'off'}",
            f"trained network: {_count(plan.parameters)} parameters, "
            f"{_count(plan.trainable_parameters)} of them trained"]


def memory_table(plan: MemoryPlan, training, world: int) -> str:
    """DDP, and FSDP2's largest rank (ranks differ by at most a row per tensor)."""
    ddp = _rows(plan.ddp, training)
    columns = {"DDP": ddp}
    if plan.fsdp:
        columns[f"FSDP2 (x{world})"] = _rows(max(plan.fsdp, key=lambda held: held.peak),
                                              training)
    label_width = max(len(label) for label, _ in ddp)
    width = max(len(cell) for rows in columns.values() for _, cell in rows)
    lines = [wrapped for line in _heading(training, world, plan)
             for wrapped in textwrap.wrap(line, 96)]
    lines.append(" " * label_width + "".join(f"  {name:>{width}}" for name in columns))
    for index, (label, _) in enumerate(ddp):
        cells = "".join(f"  {rows[index][1]:>{width}}" for rows in columns.values())
        lines.append(f"{label:{label_width}}{cells}".rstrip())
    if plan.fsdp_refusal:
        lines += textwrap.wrap(f"FSDP2 is not planned: {plan.fsdp_refusal}.", 96)
    lines += textwrap.wrap(NOT_COUNTED, 96)
    return "\n".join(lines)


def run_memory_plan(config_path: str, num_processes: int | None, gpu_memory: float | None = None,
                    frames: int = 1, size: tuple[int, int] | None = None, *,
                    context_parallel: int | None = None) -> int:
    """Exit code: 0, or 2 for a bad configuration or process count; with ``gpu_memory`` (GiB)
    1 when nothing tried fits."""
    from simpletuner.configuration import ConfigError, load_configuration
    from simpletuner.models.builtin import resolve_model_path
    try:
        configuration = load_configuration(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    training = configuration.training
    world = num_processes or training.num_processes
    if world < 1:
        print(f"--num-processes is {world}; expected 1 or more", file=sys.stderr)
        return 2
    if context_parallel is not None:
        training = replace(training, context_parallel_size=context_parallel)
    problem = mesh_problem(world, training.context_parallel_size)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    folder = resolve_model_path(training.pretrained_model_name_or_path)
    plan = memory_plan(training, folder, world)
    print(memory_table(plan, training, world))
    lines, fits = device_report(plan, training, folder, gpu_memory, frames, size)
    print("\n".join(lines))
    return 0 if fits is not False else 1
