"""`python -m simpletuner plan --memory [--num-processes N]`: the bytes each rank holds for the
model, under DDP and under FSDP2 at N processes, from the model folder's configs only (every
network is built on the meta device; no weight is read).

Counted, per rank: parameters of the trained network (trainable and frozen, by dtype), their
gradients, AdamW's state (two moments per trainable parameter and one float32 step each), the
EMA (float32), and the frozen VAE and text encoders. FSDP2 shards every parameter of the trained
network on dim 0 as torch.chunk does (rank r holds chunk r), and with it gradients, optimizer
state and EMA; the VAE and text encoders are replicated as under DDP. Not counted: activations,
the blocks FSDP2 gathers while they run, DDP's gradient buckets, allocator overhead.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from simpletuner.models.registry import get_adapter_class
from simpletuner.training.lora import add_lora
from simpletuner.training.preflight import weight_dtype

STEP_BYTES = 4  # AdamW's per-parameter step: a float32 scalar tensor


@dataclass
class RankBytes:
    """What one rank holds; each dict maps a dtype name to bytes."""

    trainable: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    frozen: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    gradients: int = 0
    optimizer: int = 0
    ema: int = 0
    frozen_components: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def total(self) -> int:
        return (sum(self.trainable.values()) + sum(self.frozen.values()) + self.gradients
                + self.optimizer + self.ema + sum(self.frozen_components.values()))


def shard_rows(rows: int, rank: int, world: int) -> int:
    """Rows of a dim-0 chunk: torch.chunk's split, which FSDP2 uses."""
    size = math.ceil(rows / world)
    return max(0, min(size, rows - rank * size))


def local_numel(shape: torch.Size, rank: int, world: int) -> int:
    if not shape:
        return 1 if rank == 0 else 0
    return shard_rows(shape[0], rank, world) * math.prod(shape[1:])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def network_class(adapter_class) -> type:
    from diffusers import UNet2DConditionModel
    return getattr(adapter_class, "transformer_class", UNet2DConditionModel)


def meta_network(adapter_class, folder: Path, training) -> torch.nn.Module:
    """The trained network as the trainer sets it up (float32, LoRA added), on the meta device."""
    cls = network_class(adapter_class)
    with torch.device("meta"):
        network = cls.from_config(cls.load_config(folder / adapter_class.trainable_component))
        if training.model_type == "lora":
            add_lora(network, adapter_class, rank=training.lora_rank, alpha=training.lora_alpha,
                     dropout=training.lora_dropout, target_modules=training.lora_target_modules)
    return network


def frozen_component_bytes(adapter_class, folder: Path, mixed_precision: str) -> dict[str, int]:
    """The VAE's and text encoders' parameter bytes, in the dtypes the trainer loads them in."""
    from diffusers import AutoencoderKL
    dtype = weight_dtype(mixed_precision)
    vae_dtype = (torch.float32 if getattr(adapter_class, "vae_float32_under_fp16", False)
                 and dtype == torch.float16 else dtype)
    held: dict[str, int] = defaultdict(int)
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(AutoencoderKL.load_config(folder / "vae"))
        held[dtype_name(vae_dtype)] += _numel(vae) * vae_dtype.itemsize
        for encoder_folder, _, encoder_class, _ in adapter_class.text_encoder_specs:
            config = encoder_class.config_class.from_pretrained(folder / encoder_folder)
            held[dtype_name(dtype)] += _numel(encoder_class(config)) * dtype.itemsize
    return held


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def rank_bytes(network: torch.nn.Module, *, rank: int, world: int, sharded: bool,
               use_ema: bool, frozen_components: dict[str, int]) -> RankBytes:
    held = RankBytes(frozen_components=dict(frozen_components))
    for parameter in network.parameters():
        numel = (local_numel(parameter.shape, rank, world) if sharded
                 else parameter.numel())
        size = numel * parameter.dtype.itemsize
        if not parameter.requires_grad:
            held.frozen[dtype_name(parameter.dtype)] += size
            continue
        held.trainable[dtype_name(parameter.dtype)] += size
        held.gradients += size
        held.optimizer += 2 * size + STEP_BYTES
        held.ema += numel * 4 if use_ema else 0
    return held


def memory_plan(configuration, model_folder: Path, world: int) -> dict[str, list[RankBytes]]:
    """{"DDP": [rank 0], "FSDP2": [each rank]} for ``world`` processes."""
    training = configuration.training
    adapter_class = get_adapter_class(training.model_family)
    network = meta_network(adapter_class, model_folder, training)
    frozen = frozen_component_bytes(adapter_class, model_folder, training.mixed_precision)
    common = {"world": world, "use_ema": training.use_ema, "frozen_components": frozen}
    return {"DDP": [rank_bytes(network, rank=0, sharded=False, **common)],
            "FSDP2": [rank_bytes(network, rank=r, sharded=True, **common) for r in range(world)]}


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"


def _by_dtype(held: dict[str, int]) -> str:
    return ", ".join(f"{_size(v)} {k}" for k, v in sorted(held.items()) if v) or "0 B"


def memory_table(plan: dict[str, list[RankBytes]], world: int, parameters: int) -> str:
    """Per rank: DDP, and FSDP2's largest rank (ranks differ by at most a row per tensor)."""
    ddp, fsdp = plan["DDP"][0], max(plan["FSDP2"], key=lambda held: held.total)
    rows = [("trainable parameters", _by_dtype(ddp.trainable), _by_dtype(fsdp.trainable)),
            ("frozen parameters (network)", _by_dtype(ddp.frozen), _by_dtype(fsdp.frozen)),
            ("gradients", _size(ddp.gradients), _size(fsdp.gradients)),
            ("optimizer state (AdamW)", _size(ddp.optimizer), _size(fsdp.optimizer)),
            ("EMA", _size(ddp.ema), _size(fsdp.ema)),
            ("VAE + text encoders (replicated)", _by_dtype(ddp.frozen_components),
             _by_dtype(fsdp.frozen_components)),
            ("total per rank", _size(ddp.total), _size(fsdp.total))]
    width = max(len(r[0]) for r in rows)
    count = f"{parameters / 1e9:.2f} B" if parameters >= 1e8 else f"{parameters / 1e6:.2f} M"
    lines = [f"memory per rank at {world} processes; trained network: {count} parameters", f"{'':{width}}  {'DDP':>24}  {f'FSDP2 (x{world})':>24}"]
    lines += [f"{label:{width}}  {a:>24}  {b:>24}" for label, a, b in rows]
    lines.append("Activations are not included (they depend on batch size, resolution and "
                 "gradient_checkpointing), nor FSDP2's gathered block while it runs.")
    return "\n".join(lines)


def run_memory_plan(config_path: str, num_processes: int | None) -> int:
    """Exit code: 0, or 2 for a bad configuration or process count."""
    from simpletuner.configuration import ConfigError, load_configuration
    from simpletuner.models.builtin import resolve_model_path
    try:
        configuration = load_configuration(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    world = num_processes or configuration.training.num_processes
    if world < 1:
        print(f"--num-processes is {world}; expected 1 or more", file=sys.stderr)
        return 2
    folder = resolve_model_path(configuration.training.pretrained_model_name_or_path)
    adapter_class = get_adapter_class(configuration.training.model_family)
    parameters = _numel(meta_network(adapter_class, folder, configuration.training))
    print(memory_table(memory_plan(configuration, folder, world), world, parameters))
    return 0
