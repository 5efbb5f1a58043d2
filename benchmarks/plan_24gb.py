"""The memory plan of the 4–20 B families on one 24 GiB card, with and without block swap.

    python benchmarks/plan_24gb.py [--gpu-memory 24] [--json]

Planned, not measured: each model folder holds its published configs
(benchmarks/published_configs.json, tests/fixtures/flux2_published_configs.json) with the
tokenizers and scheduler of the family's tiny built-in model, so nothing is downloaded and no
weight exists. For each, a LoRA (rank 16, bf16
base, adamw, batch 1, gradient checkpointing, VAE and text encoders offloaded after caching)
is planned as `plan --memory --gpu-memory` plans it (training/memory/fitting.py): the device
peak without block swap, then the fewest swapped blocks that fit, with that peak and what the
host then holds. FLUX.2-dev is left out: its tokenizer is a PixtralProcessor, which the plan
cannot load offline, and its 24 B text encoder alone is 45 GiB in bf16.
benchmarks/bench_block_swap_gpu.py measures peaks on a GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from benchlib import emit, format_table, parse_with_smoke
from simpletuner.configuration.options import TrainingConfig
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.memory.activations import activation_bytes, planned_size
from simpletuner.training.memory.fitting import (BlockCosts, Setting, device_peak,
                                                 fitting_setting)
from simpletuner.training.memory.model import memory_plan, meta_network

GIB = 1 << 30
TOKENIZERS = ("tokenizer", "tokenizer_2", "scheduler")
LORA = dict(model_type="lora", lora_rank=16, mixed_precision="bf16", train_batch_size=1,
            gradient_checkpointing=True, frozen_components_after_caching="offload")


def published() -> dict[str, tuple[str, dict, dict]]:
    """name: (family, {subfolder: config}, planned options)."""
    here = Path(__file__).resolve().parent
    configs = json.loads((here / "published_configs.json").read_text(encoding="utf-8"))
    flux2 = json.loads((here.parent / "tests" / "fixtures" / "flux2_published_configs.json")
                       .read_text(encoding="utf-8"))
    klein = {**flux2["klein-9b"]["configs"], "vae": flux2["vae"]}
    square = dict(resolution=1024)
    wan = dict(resolution=0.4, resolution_type="area")
    return {
        "FLUX.1-dev 12B, 1024px": ("flux", configs["flux-dev"], square),
        "FLUX.2-klein-9B, 1024px": ("flux2", klein, dict(square, model_flavour="klein-9b")),
        "Qwen-Image 20B, 1024px": ("qwen_image", configs["qwen-image"], square),
        "Wan 2.1 14B, 0.4 MP image": ("wan", configs["wan-14b"], wan),
        "Wan 2.1 14B, 0.4 MP x 33 frames": ("wan", configs["wan-14b"], dict(wan, frames=33)),
    }


def write_folder(root: Path, family: str, configs: dict) -> Path:
    folder = root / family
    if folder.exists():
        return folder
    tiny = ensure_builtin_model(f"tiny-{family}")
    for subfolder, config in configs.items():
        (folder / subfolder).mkdir(parents=True)
        (folder / subfolder / "config.json").write_text(json.dumps(config))
    for name in TOKENIZERS:
        if (tiny / name).is_dir():
            shutil.copytree(tiny / name, folder / name)
    shutil.copy(tiny / "model_index.json", folder / "model_index.json")
    return folder


def plan_row(name: str, family: str, folder: Path, options: dict, budget: int) -> dict:
    frames = options.pop("frames", 1)
    training = TrainingConfig(model_family=family, pretrained_model_name_or_path=str(folder),
                              output_dir="unused", data_backend_config="unused",
                              **LORA, **options)
    adapter_class = get_adapter_class(family).for_folder(folder)
    held = memory_plan(training, folder, 1).ddp
    height, width = planned_size(training)
    activations = activation_bytes(adapter_class, folder, training,
                                   meta_network(adapter_class, folder, training),
                                   batch_size=1, height=height, width=width, frames=frames)
    costs = BlockCosts.of(adapter_class.swappable_blocks(
        meta_network(adapter_class, folder, training)), training)
    plain = device_peak(held, activations, costs, Setting.of(training))
    found = fitting_setting(held, activations, costs, training, budget)
    swapped = found[1] if found else None
    return {"model": name, "size": f"{width}x{height}" + (f"x{frames}" if frames > 1 else ""),
            "blocks": len(costs.weights), "activations_gib": plain.activations / GIB,
            "caching_gib": plain.while_caching / GIB, "training_gib": plain.while_training / GIB,
            "fits_without_swap": "yes" if plain.peak <= budget else "no",
            "blocks_to_swap": found[0].musubi_blocks_to_swap if found else None,
            "peak_with_swap_gib": swapped.peak / GIB if swapped else None,
            "on_host_gib": swapped.on_host / GIB if swapped else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-memory", type=float, default=24.0)
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser)
    budget = int(args.gpu_memory * GIB)
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-24gb-") as tmp:
        planned = list(published().items())[:1 if args.smoke else None]
        for name, (family, configs, options) in planned:
            folder = write_folder(Path(tmp), family, configs)
            rows.append(plan_row(name, family, folder, dict(options), budget))
    columns = ("model", "size", "blocks", "activations_gib", "caching_gib", "training_gib",
               "fits_without_swap", "blocks_to_swap", "peak_with_swap_gib", "on_host_gib")
    text = (f"LoRA rank 16, bf16, batch 1, gradient checkpointing, on {args.gpu_memory:g} GiB "
            "(planned, not measured)\n"
            + format_table(columns, [[row[c] for c in columns] for row in rows]))
    emit({"gpu_memory_gib": args.gpu_memory, "rows": rows}, args.json, text)


if __name__ == "__main__":
    main()
