"""Block swap on a GPU: measured peak beside the plan's, with and without swapped blocks.

    python benchmarks/bench_block_swap_gpu.py [--steps 3] [--json]

For builtin:tiny-flux and a mid-sized Flux (8 double and 16 single blocks of width 1536,
random weights, tiny-flux's encoders), a LoRA and a full run train ``--steps`` steps in bf16
with gradient checkpointing, first with every block on the device, then with half of them
swapped (musubi_blocks_to_swap). Each prints torch.cuda.max_memory_allocated after the steps
beside the plan's device peak while training (training/memory/fitting.py, the VAE and text
encoders kept) and their ratio, and the seconds per step (block swap trades time for memory).
Without CUDA it runs the same steps on the CPU and reports times only, so the script itself
is checked anywhere (`--models tiny-flux`: the mid-sized one needs about 16 GB of memory);
the figures that matter need a GPU. Takes a few minutes on one GPU.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from benchlib import data_folder, emit, format_table, parse_with_smoke, ratio
from simpletuner.configuration.options import TrainingConfig
from simpletuner.models.base import PLANNED_CAPTION, LossSettings
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.activations import activation_bytes
from simpletuner.training.memory.block_swap import place_network
from simpletuner.training.memory.fitting import BlockCosts, Setting, device_peak
from simpletuner.training.memory.quantization import quantize_frozen_weights
from simpletuner.training.memory.model import memory_plan, meta_network
from simpletuner.training.settings import BlockSwapSettings, PrecisionSettings

GIB = 1 << 30
SIZE = 512
MID_FLUX = dict(num_layers=8, num_single_layers=16, attention_head_dim=128,
                num_attention_heads=12)


def mid_flux_folder() -> Path:
    """tiny-flux with its transformer replaced by a mid-sized one (built once, kept)."""
    folder = data_folder("mid-flux")
    if (folder / "transformer").is_dir():
        return folder
    from diffusers import FluxTransformer2DModel
    tiny = ensure_builtin_model("tiny-flux")
    shutil.copytree(tiny, folder, dirs_exist_ok=True)
    config = FluxTransformer2DModel.load_config(tiny / "transformer")
    torch.manual_seed(0)
    FluxTransformer2DModel.from_config({**config, **MID_FLUX}).save_pretrained(
        folder / "transformer")
    return folder


def training_config(folder: Path, model_type: str, swapped: int) -> TrainingConfig:
    return TrainingConfig(model_family="flux", pretrained_model_name_or_path=str(folder),
                          output_dir="unused", data_backend_config="unused",
                          model_type=model_type, lora_rank=16, mixed_precision="bf16",
                          gradient_checkpointing=True, train_batch_size=1, resolution=SIZE,
                          frozen_components_after_caching="keep",
                          musubi_blocks_to_swap=swapped)


def planned_peak(folder: Path, training) -> int:
    adapter_class = get_adapter_class("flux")
    held = memory_plan(training, folder, 1).ddp
    activations = activation_bytes(adapter_class, folder, training,
                                   meta_network(adapter_class, folder, training),
                                   batch_size=1, height=SIZE, width=SIZE)
    costs = BlockCosts.of(adapter_class.swappable_blocks(
        meta_network(adapter_class, folder, training)), training)
    return device_peak(held, activations, costs, Setting.of(training)).while_training


def measured(folder: Path, training, device: torch.device, steps: int) -> tuple[int | None, float]:
    """(peak bytes allocated on CUDA, seconds per step after the first)."""
    adapter_class = get_adapter_class("flux")
    dtype = torch.bfloat16
    adapter = adapter_class.load(folder, device=torch.device("cpu"), weight_dtype=dtype,
                                 loss_settings=LossSettings())
    quantize_frozen_weights(adapter, PrecisionSettings.from_config(training), dtype)
    place_network(adapter, BlockSwapSettings.from_config(training), device)
    if training.model_type == "lora":
        add_adapter(adapter.trainable, adapter_class, training)
    adapter.set_gradient_checkpointing(True)
    pixels = torch.rand(1, 3, SIZE, SIZE, device=device) * 2 - 1
    batch = TrainingBatch(latents=adapter.encode_images(pixels),
                          prompt_embeds=adapter.encode_prompts([PLANNED_CAPTION]),
                          original_sizes=[(SIZE, SIZE)], crop_top_lefts=[(0, 0)],
                          target_sizes=[(SIZE, SIZE)])
    optimizer = torch.optim.AdamW([p for p in adapter.trainable.parameters() if p.requires_grad])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = None
    for step in range(steps):
        if step == 1:
            started = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype):
            loss = adapter.compute_loss(batch, torch.Generator().manual_seed(step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / (steps - 1)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return peak, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["tiny-flux", "mid-flux"],
                        choices=["tiny-flux", "mid-flux"])
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, models=["tiny-flux"], steps=2)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    models = {"tiny-flux": (ensure_builtin_model, 2), "mid-flux": (lambda _: mid_flux_folder(), 24)}
    rows = []
    for name in args.models:
        folder_of, blocks = models[name]
        folder = folder_of(name)
        for model_type in ("lora", "full"):
            for swapped in (0, blocks // 2):
                training = training_config(folder, model_type, swapped)
                plan = planned_peak(folder, training)
                peak, seconds = measured(folder, training, device, max(args.steps, 2))
                rows.append({"model": name, "mode": model_type, "swapped": swapped,
                             "planned_gib": plan / GIB,
                             "measured_gib": peak / GIB if peak is not None else None,
                             "measured_over_planned": ratio(peak, plan) if peak else None,
                             "seconds_per_step": seconds})
    columns = list(rows[0])
    text = (f"{device.type}: peak while training, batch 1 at {SIZE}px, bf16, gradient "
            "checkpointing\n" + format_table(columns, [[r[c] for c in columns] for r in rows]))
    emit({"device": device.type, "rows": rows}, args.json, text)


if __name__ == "__main__":
    main()
