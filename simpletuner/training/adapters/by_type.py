"""The adapter a LoRA run trains, by lora_type: peft LoRA (lora.py) or LyCORIS
(lycoris_adapter.py); added, and exported, in one place for the trainer and the memory plan."""

from __future__ import annotations

from pathlib import Path

import torch

from simpletuner.training.adapters.lora import LORA_DIR, LORA_WEIGHTS, add_lora, export_lora
from simpletuner.training.adapters.lycoris_adapter import add_lycoris, write_lycoris
from simpletuner.training.run.adapter_checks import read_lycoris_config


def add_adapter(network: torch.nn.Module, adapter_class, training) -> None:
    """Freeze ``network`` and add the adapter ``training`` (a TrainingConfig) asks for."""
    if training.lora_type == "lycoris":
        add_lycoris(network, read_lycoris_config(training.lycoris_config), adapter_class.family)
    else:
        add_lora(network, adapter_class, rank=training.lora_rank, alpha=training.lora_alpha,
                 dropout=training.lora_dropout, target_modules=training.lora_target_modules)


def export_adapter(adapter_class, network: torch.nn.Module, output_dir: Path,
                   training) -> Path:
    """output_dir/lora/pytorch_lora_weights.safetensors: a LyCORIS file for lora_type
    'lycoris' (ComfyUI and LyCORIS read its lycoris_ keys), else the LoRA in lora_format."""
    if training.lora_type == "lycoris":
        path = Path(output_dir) / LORA_DIR / LORA_WEIGHTS
        return write_lycoris(network, read_lycoris_config(training.lycoris_config),
                             adapter_class.family, path)
    return export_lora(adapter_class, network, output_dir, training.lora_format)
