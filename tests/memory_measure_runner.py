"""Sets up each built-in model as the trainer does (LoRA added, EMA, AdamW with state after one
step) and writes the bytes of the tensors this rank holds, unsharded (DDP) and then sharded
with FSDP2, to OUT/rank-<k>.json.

    torchrun --standalone --nproc_per_node 2 memory_measure_runner.py OUT CASES_JSON"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from accelerate import Accelerator

from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import resolve_model_path
from simpletuner.models.registry import get_adapter_class
from simpletuner.common.clean_exit import exit_process
from simpletuner.training.ema import EMAWeights
from simpletuner.training.lora import add_lora
from simpletuner.training.preflight import weight_dtype
from simpletuner.training.memory.sharding import local, shard_network
from simpletuner.training.settings import ShardingSettings
from settings_fixtures import settings


def nbytes(tensor: torch.Tensor) -> int:
    part = local(tensor)
    return part.numel() * part.element_size()


def held(network, frozen_modules) -> dict:
    trainable = [p for p in network.parameters() if p.requires_grad]
    for parameter in trainable:
        parameter.grad = torch.zeros_like(parameter)
    optimizer = torch.optim.AdamW(trainable)
    optimizer.step()
    ema = EMAWeights(network, 0.99)
    by_dtype = {"trainable": defaultdict(int), "frozen": defaultdict(int),
                "frozen_components": defaultdict(int)}
    for parameter in network.parameters():
        kind = "trainable" if parameter.requires_grad else "frozen"
        by_dtype[kind][str(parameter.dtype).removeprefix("torch.")] += nbytes(parameter)
    for module in frozen_modules:
        for parameter in module.parameters():
            name = str(parameter.dtype).removeprefix("torch.")
            by_dtype["frozen_components"][name] += nbytes(parameter)
    return {**by_dtype, "gradients": sum(nbytes(p.grad) for p in trainable),
            "optimizer": sum(nbytes(v) for s in optimizer.state.values() for v in s.values()),
            "ema": sum(nbytes(t) for t in ema.shadow.values())}


def measure(case: dict, device: torch.device) -> dict:
    adapter_class = get_adapter_class(case["family"])
    adapter = adapter_class.load(resolve_model_path(f"builtin:tiny-{case['family']}"),
                                 device=device, weight_dtype=weight_dtype(case["precision"]),
                                 loss_settings=LossSettings())
    network = adapter.trainable
    if case["lora"]:
        add_lora(network, adapter_class, rank=4)
    frozen = [adapter.vae, *adapter.text_encoders]
    unsharded = held(network, frozen)
    for parameter in network.parameters():
        parameter.grad = None
    shard_network(network, settings(ShardingSettings, fsdp_enable=True,
                                    mixed_precision=case["precision"]), device.type)
    return {"ddp": unsharded, "fsdp": held(network, frozen)}


def main() -> None:
    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    for case in cases:  # built before the process group exists (transformers then saves once)
        resolve_model_path(f"builtin:tiny-{case['family']}")
    accelerator = Accelerator(cpu=True)
    results = [measure(case, accelerator.device) for case in cases]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(results))
    accelerator.end_training()
    exit_process(0)  # as the trainer exits: see exit_process


if __name__ == "__main__":
    main()
