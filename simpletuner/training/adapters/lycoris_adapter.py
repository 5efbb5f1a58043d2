"""LyCORIS adapters (LoKr, LoHa, LoCon, LoRA, full) through the lycoris-lora library, as
SimpleTuner's lora_type 'lycoris' builds them: apply_preset from lycoris_config, then
create_lycoris with its other keys, then apply_to.

The LycorisNetwork becomes the submodule ``lycoris`` of the trained network, so the optimizer,
EMA, gradient clipping and DDP see its parameters as the network's own (its modules keep the
wrapped layers in lists, so nothing is registered twice). Checkpoints and the export hold its
state dict: keys ``lycoris_<module path>.<algo tensor>``, the layout LyCORIS's
create_lycoris_from_weights and ComfyUI read. lycoris-lora is an extra (simpletuner[lycoris]),
imported only when a LyCORIS adapter is built."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch

from simpletuner.training.adapters.adapter_file import write_adapter_file

SUBMODULE = "lycoris"
# The LycorisNetwork class attributes apply_preset sets (it configures the class, not one
# network); restored after each network is built, so one run's preset never leaks into another.
_PRESET_ATTRIBUTES = ("ENABLE_CONV", "TARGET_REPLACE_MODULE", "TARGET_REPLACE_NAME",
                      "MODULE_ALGO_MAP", "NAME_ALGO_MAP", "LORA_PREFIX", "USE_FNMATCH",
                      "TARGET_EXCLUDE_NAME")
_CALL_KEYS = ("multiplier", "linear_dim", "linear_alpha", "apply_preset")
# create_lycoris applies its own `preset` after apply_preset's: of LyCORIS's built-in presets,
# these two set nothing a LycorisNetwork reads but enable_conv, so the one that matches
# apply_preset's enable_conv keeps it (with "full" alone, "enable_conv": false was ignored).
_PRESET_BY_ENABLE_CONV = {True: "full", False: "full-lin"}


class LycorisTargetError(ValueError):
    """lycoris_config's preset selects no module of the network."""


@contextmanager
def _preset(network_class, preset: dict | None):
    saved = {name: getattr(network_class, name) for name in _PRESET_ATTRIBUTES}
    try:
        if preset:
            network_class.apply_preset(preset)
        yield
    finally:
        for name, value in saved.items():
            setattr(network_class, name, value)


def add_lycoris(network: torch.nn.Module, config: dict, family: str) -> torch.nn.Module:
    """Freeze ``network`` and apply the LyCORIS adapter ``config`` (lycoris_config's object)
    describes; afterwards only the adapter's parameters require grad. Returns the
    LycorisNetwork."""
    from lycoris import LycorisNetwork, create_lycoris

    network.requires_grad_(False)
    options = {k: v for k, v in config.items() if k not in _CALL_KEYS + ("preset",)}
    enable_conv = (config.get("apply_preset") or {}).get("enable_conv", True) is not False
    with _preset(LycorisNetwork, config.get("apply_preset")):
        lycoris = create_lycoris(network, float(config.get("multiplier", 1.0)),
                                 preset=_PRESET_BY_ENABLE_CONV[enable_conv],
                                 linear_dim=config.get("linear_dim", 4),
                                 linear_alpha=config.get("linear_alpha", 1),
                                 warn_on_unmatched=False, **options)
    if not lycoris.loras:
        raise LycorisTargetError(
            f"lycoris_config's apply_preset selects no module of the {family} "
            f"{type(network).__name__}; name its module classes in target_module (e.g. "
            f"{sorted({type(m).__name__ for m in network.modules()})[:12]}) or its module "
            "paths in target_name")
    lycoris.apply_to()
    lycoris.built_from = (dict(config), family)  # to build the same adapter on a copy
    network.add_module(SUBMODULE, lycoris)
    lycoris.requires_grad_(True)
    return lycoris


def add_same_lycoris(source: torch.nn.Module, copy: torch.nn.Module) -> None:
    """Put on ``copy`` (of the same class) the LyCORIS adapter ``source`` has, if it has one;
    FSDP2's gathered copy for the export and validation is one."""
    lycoris = lycoris_of(source)
    if lycoris is not None:
        add_lycoris(copy, *lycoris.built_from)


def lycoris_of(network: torch.nn.Module) -> torch.nn.Module | None:
    """The LycorisNetwork add_lycoris put on ``network``, or None (a peft LoRA)."""
    return network._modules.get(SUBMODULE)  # a submodule only, never a diffusers attribute


def lycoris_state_dict(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors, LyCORIS key names, detached contiguous copies."""
    return {name: tensor.detach().contiguous().clone()
            for name, tensor in lycoris_of(network).state_dict().items()}


def load_lycoris_state(network: torch.nn.Module, tensors: dict[str, torch.Tensor],
                       path: Path) -> None:
    expected = set(lycoris_of(network).state_dict())
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ValueError(f"{path} does not fit this run's LyCORIS adapter ({len(missing)} "
                         f"tensors missing, e.g. {missing[:1]}; {len(extra)} unexpected, e.g. "
                         f"{extra[:1]}); was it saved with another lycoris_config?")
    lycoris_of(network).load_state_dict(tensors, strict=True)


def export_metadata(config: dict, family: str) -> dict[str, str]:
    """kohya's metadata keys, as LyCORIS's own trainers write them, and the config itself."""
    arguments = {k: v for k, v in config.items() if k not in _CALL_KEYS}
    return {"ss_network_module": "lycoris.kohya",
            "ss_network_dim": str(config.get("linear_dim", 4)),
            "ss_network_alpha": str(config.get("linear_alpha", 1)),
            "ss_network_args": json.dumps(arguments, sort_keys=True),
            "lycoris_config": json.dumps(config, sort_keys=True), "model_family": family}


def write_lycoris(network: torch.nn.Module, config: dict, family: str, path: Path) -> Path:
    """The LyCORIS file at ``path``, with the tensor hash as LyCORIS's save_weights writes it."""
    return write_adapter_file(path, lycoris_state_dict(network), export_metadata(config, family),
                              hash_prefix="0x")
