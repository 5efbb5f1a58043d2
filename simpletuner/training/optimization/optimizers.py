"""Optimizers by SimpleTuner's names: which library provides each, what it needs, and how it is
built from config.json (learning_rate, adam_* options, then ``optimizer_config`` overrides, each
checked against the optimizer's signature).

Each library is imported only when its optimizer is asked for, so a run that does not use it
needs neither the package nor (for bitsandbytes) CUDA."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from simpletuner.training.settings import OptimizerSettings


def _torch_adamw():
    return torch.optim.AdamW


def _optimi_adamw():
    from optimi import AdamW
    return AdamW


def _torchao_adamw8bit():
    from torchao.optim import AdamW8bit
    return AdamW8bit


def _bnb_adamw8bit():
    from bitsandbytes.optim import AdamW8bit
    return AdamW8bit


def _prodigy():
    from prodigyopt import Prodigy
    return Prodigy


def _torch_adafactor():
    return torch.optim.Adafactor


def _lion():
    from lion_pytorch import Lion
    return Lion


@dataclass(frozen=True)
class OptimizerSpec:
    load_class: Callable[[], type]
    module: str | None        # the import that must be available (None: part of torch)
    install: str | None       # what to pip install when it is not
    needs_cuda: bool = False
    bf16_weights: bool = False  # keeps its own precision (Kahan summation): weights stay bf16
    fixed: tuple[tuple[str, Any], ...] = ()  # keyword arguments that define the name


OPTIMIZERS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec(_torch_adamw, None, None),
    "adamw_bf16": OptimizerSpec(_optimi_adamw, "optimi", "pip install 'simpletuner[optimizers]'",
                                bf16_weights=True, fixed=(("kahan_sum", True),)),
    "ao-adamw8bit": OptimizerSpec(_torchao_adamw8bit, "torchao",
                                  "pip install 'simpletuner[optimizers]'"),
    "bnb-adamw8bit": OptimizerSpec(_bnb_adamw8bit, "bitsandbytes",
                                   "pip install 'simpletuner[quantization]'", needs_cuda=True),
    "prodigy": OptimizerSpec(_prodigy, "prodigyopt", "pip install 'simpletuner[optimizers]'"),
    "adafactor": OptimizerSpec(_torch_adafactor, None, None),
    "lion": OptimizerSpec(_lion, "lion_pytorch", "pip install 'simpletuner[optimizers]'"),
}

# Splits "a=1,betas=[0.9,0.99]" at the commas outside brackets.
_ITEM_SEPARATOR = re.compile(r",(?![^\[]*\])")


def parse_optimizer_config(text: str | None) -> dict[str, Any]:
    """SimpleTuner's 'name=value,name=value'; each value is read as JSON (numbers, true/false,
    lists), else as True/False, else kept as a string."""
    parsed: dict[str, Any] = {}
    for item in _ITEM_SEPARATOR.split(text or ""):
        if not item.strip():
            continue
        name, separator, raw = item.partition("=")
        if not separator or not name.strip():
            raise ValueError(f"'{item.strip()}' is not name=value")
        raw = raw.strip()
        try:
            value = json.loads(raw)
        except ValueError:
            value = {"True": True, "False": False}.get(raw, raw)
        parsed[name.strip()] = value
    return parsed


def optimizer_problems(settings: OptimizerSettings, cuda_available: bool) -> list[str]:
    """What stops this config's optimizer here: a missing library, no CUDA, a bad
    optimizer_config, adamw_bf16 without bf16 autocast. Imports nothing heavy but the class."""
    spec = OPTIMIZERS[settings.optimizer]
    name = settings.optimizer
    if spec.module and importlib.util.find_spec(spec.module) is None:
        return [f"key 'optimizer' is '{name}', which needs the {spec.module} package: "
                f"{spec.install}"]
    if spec.needs_cuda and not cuda_available:
        return [f"key 'optimizer' is '{name}', which needs a CUDA device (bitsandbytes); use "
                "'ao-adamw8bit' or 'adamw_bf16' on this machine"]
    problems = []
    if spec.bf16_weights and settings.mixed_precision != "bf16":
        problems.append(f"key 'optimizer' is '{name}', which trains bf16 weights; set "
                        "mixed_precision to 'bf16'")
    try:
        optimizer_arguments(settings)
    except ValueError as exc:
        problems.append(f"key 'optimizer_config': {exc}")
    return problems


def optimizer_arguments(settings: OptimizerSettings) -> dict[str, Any]:
    """Keyword arguments for the optimizer class besides the parameters: the config's
    learning_rate and adam_* values where the signature has them, the name's fixed ones, then
    optimizer_config. Raise ValueError naming any key the signature does not accept."""
    spec = OPTIMIZERS[settings.optimizer]
    signature = inspect.signature(spec.load_class()).parameters
    accepted = set(signature) - {"params", "self"}
    defaults = {"lr": settings.learning_rate,
                "betas": (settings.adam_beta1, settings.adam_beta2),
                "weight_decay": settings.adam_weight_decay, "eps": settings.adam_epsilon}
    # Only where the meaning matches: Adafactor's eps is a pair, not Adam's epsilon.
    arguments = {k: v for k, v in defaults.items() if k in accepted and (
        signature[k].default is inspect.Parameter.empty
        or isinstance(signature[k].default, (type(v), int)))}
    arguments.update(spec.fixed)
    extra = parse_optimizer_config(settings.optimizer_config)
    unknown = sorted(set(extra) - accepted)
    if unknown:
        raise ValueError(f"{unknown} are not arguments of {settings.optimizer} "
                         f"({spec.load_class().__name__}); it accepts {sorted(accepted)}")
    arguments.update(extra)
    return arguments


def trained_dtype(optimizer: str) -> torch.dtype:
    """The dtype of what trains: bf16 for an optimizer that keeps its own precision (no fp32
    copy is kept), else float32 (a LoRA on a bf16 base starts in bf16)."""
    return torch.bfloat16 if OPTIMIZERS[optimizer].bf16_weights else torch.float32


def cast_trainable(network: torch.nn.Module, optimizer: str) -> list[torch.nn.Parameter]:
    """``network``'s trainable parameters, cast to ``trained_dtype`` in place."""
    dtype = trained_dtype(optimizer)
    parameters = [p for p in network.parameters() if p.requires_grad]
    for parameter in parameters:
        if parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    return parameters


def build_optimizer(network: torch.nn.Module,
                    settings: OptimizerSettings) -> torch.optim.Optimizer:
    """The configured optimizer over ``network``'s trainable parameters, cast to
    ``trained_dtype`` first."""
    parameters = cast_trainable(network, settings.optimizer)
    return OPTIMIZERS[settings.optimizer].load_class()(parameters,
                                                      **optimizer_arguments(settings))
