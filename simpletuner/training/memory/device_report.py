"""`plan --memory`'s last section: one rank's device peak with the activations of a
micro-batch of train_batch_size at the planned size (1/C of its sequence inside the blocks
with context_parallel_size C), block swap as configured, and with
``--gpu-memory`` whether it fits and the first settings that would (fitting.py)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.families import family_spec
from simpletuner.training.memory.activations import activation_bytes, planned_size
from simpletuner.training.memory.fitting import (BlockCosts, Setting, changes, device_peak,
                                                 fitting_setting)
from simpletuner.training.memory.model import MemoryPlan, meta_network

GIB = 1 << 30


def byte_size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"


def device_report(plan: MemoryPlan, training, folder: Path, gpu_memory: float | None,
                  frames: int, size: tuple[int, int] | None = None
                  ) -> tuple[list[str], bool | None]:
    """(lines, whether it fits in ``gpu_memory`` GiB; None without it); ``size``: the
    micro-batch's (width, height), else planned_size's."""
    if family_spec(training.model_family).trains_unet:
        return [f"activations: estimated for the transformer families only, not "
                f"{training.model_family}"], None
    from simpletuner.models.registry import get_adapter_class
    adapter_class = get_adapter_class(training.model_family).for_folder(folder)
    needed = [spec[1] for spec in adapter_class.text_encoder_specs] + ["scheduler"]
    missing = [name for name in needed if not (folder / name).is_dir()]
    if missing:
        return [f"activations: not estimated; they need the model folder's "
                f"{', '.join(f'{name}/' for name in missing)} (the tokenizers give the "
                "prompts' shapes)"], None
    width, height = size or planned_size(training)[::-1]
    activations = activation_bytes(adapter_class, folder, training,
                                   meta_network(adapter_class, folder, training),
                                   batch_size=training.train_batch_size, height=height,
                                   width=width, frames=frames
                                   ).per_rank(training.context_parallel_size)
    network = meta_network(adapter_class, folder, training)
    costs = BlockCosts.of(adapter_class.swappable_blocks(network), training)
    setting = Setting.of(training)
    peak = device_peak(plan.ddp, activations, costs, setting)
    clip = f"x{frames} frames" if frames > 1 else ""
    if training.context_parallel_size > 1:
        clip += f", 1/{training.context_parallel_size} of its sequence (context_parallel_size)"
    lines = [f"one device, a micro-batch of {training.train_batch_size} at {width}x{height}"
             f"{clip}, gradient_checkpointing {'on' if setting.gradient_checkpointing else 'off'}"
             f", {setting.musubi_blocks_to_swap} of {len(costs.weights)} blocks swapped:",
             f"  activations (saved for the backward)   {byte_size(peak.activations)}",
             f"  block swap: on the host                {byte_size(peak.on_host)}",
             f"  block swap: staged copies              {byte_size(peak.staged)}",
             f"  peak while caching                     {byte_size(peak.while_caching)}",
             f"  peak while training                    {byte_size(peak.while_training)}"]
    if gpu_memory is None:
        return lines, None
    budget = int(gpu_memory * GIB)
    found = fitting_setting(plan.ddp, activations, costs, training, budget)
    if found is None:
        lines.append(f"does not fit in {gpu_memory:g} GiB, not even with every block swapped")
        return lines, False
    fitting, fitting_peak = found
    if fitting == setting:
        lines.append(f"fits in {gpu_memory:g} GiB (peak {byte_size(peak.peak)})")
        return lines, True
    lines.append(f"does not fit in {gpu_memory:g} GiB (peak {byte_size(peak.peak)}); fits with "
                 f"{changes(setting, fitting)} (peak {byte_size(fitting_peak.peak)})")
    return lines, False

