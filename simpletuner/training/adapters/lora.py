"""LoRA training through peft, for every family: inject an adapter into the trainable network
(only its weights then require grad), checkpoint adapter weights only, and export them where
diffusers' ``load_lora_weights`` reads them: output_dir/lora/pytorch_lora_weights.safetensors.

Default target modules come from the adapter class (``lora_target_modules``); the pipeline
class's own ``save_lora_weights`` writes the export, as diffusers' LoRA training examples do. A
pipeline without a LoRA loader whose network has peft support (LongCat-Image) gets diffusers'
shared writer with the same keys, which the network's ``load_lora_adapter`` reads. A network
diffusers gives no peft methods (PixArt's transformer) gets the adapter from peft itself, and
its export is written in the same layout here (``write_lora_file``), to be put back with
``load_peft_lora_file``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors import safe_open

from simpletuner.common.atomic import give_umask_modes, naming_path, staging_folder
from simpletuner.training.adapters.adapter_file import write_adapter_file
from simpletuner.training.adapters.lora_formats import write_comfyui_lora
from simpletuner.training.adapters.lycoris_adapter import (load_lycoris_state, lycoris_of,
                                                   lycoris_state_dict)
from simpletuner.training.checkpointing.tensor_files import load_tensors, save_tensors

LORA_DIR = "lora"
LORA_WEIGHTS = "pytorch_lora_weights.safetensors"
LORA_CONFIG_KEY = "lora_adapter_metadata"  # the adapter config, as diffusers' metadata names it
CHECKPOINT_WEIGHTS = "lora_adapter.safetensors"  # inside checkpoint-<step>/, peft key names
# Module types peft can wrap with a LoRA layer.
_ADAPTABLE = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Embedding)


class LoraTargetError(ValueError):
    """lora_target_modules names something the network does not have."""


def _matches(module_name: str, target: str) -> bool:
    """peft's rule for a list of targets: the full name, or a suffix after a dot."""
    return module_name == target or module_name.endswith("." + target)


def _short_name(module_name: str) -> str:
    """The part of a module name a target is usually written as: "to_q", "to_out.0"."""
    parts = module_name.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def check_target_modules(network: torch.nn.Module, targets: list[str], family: str) -> None:
    """Raise LoraTargetError naming each target that matches no adaptable module, with a
    sample of the names this family's network has."""
    names = [name for name, module in network.named_modules() if isinstance(module, _ADAPTABLE)]
    unmatched = [t for t in targets if not any(_matches(name, t) for name in names)]
    if not unmatched:
        return
    available = sorted({_short_name(name) for name in names})
    sample = ", ".join(available[:40]) + (", ..." if len(available) > 40 else "")
    raise LoraTargetError(
        f"lora_target_modules {unmatched} match no Linear/Conv/Embedding module of the "
        f"{family} {type(network).__name__}. Its module names end in: {sample}. Use some of "
        "those, or leave lora_target_modules unset for the family's attention projections")


def add_lora(network: torch.nn.Module, adapter_class, *, rank: int, alpha: float | None = None,
             dropout: float = 0.0, target_modules: list[str] | None = None) -> LoraConfig:
    """Freeze ``network`` and inject a LoRA adapter ("default") into it; afterwards only the
    adapter's parameters require grad. ``adapter_class`` is the family's ModelAdapter class,
    which gives the default targets. B starts at zero: the adapted network starts unchanged."""
    targets = list(target_modules or adapter_class.lora_target_modules)
    check_target_modules(network, targets, adapter_class.family)
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank,
                        lora_dropout=dropout, init_lora_weights="gaussian",
                        target_modules=targets)
    network.requires_grad_(False)
    inject_lora(network, config)
    return config


def inject_lora(network: torch.nn.Module, config: LoraConfig) -> None:
    """``config`` as the adapter "default" of ``network``: through diffusers' add_adapter, or
    peft's own injection for a network diffusers gives no peft methods (PixArt's)."""
    if hasattr(network, "add_adapter"):
        network.add_adapter(config)
    else:
        inject_adapter_in_model(config, network, adapter_name="default")


def adapter_state_dict(network: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's weights only, peft key names (LyCORIS's for a LyCORIS adapter), detached
    contiguous copies."""
    if lycoris_of(network) is not None:
        return lycoris_state_dict(network)
    return {name: tensor.detach().contiguous().clone()
            for name, tensor in get_peft_model_state_dict(network).items()}


def save_adapter_weights(network: torch.nn.Module, path: Path) -> None:
    """Adapter weights as safetensors: refused when non-finite, written under a temporary name,
    flushed to disk, then renamed (see tensor_files.save_tensors)."""
    save_tensors(adapter_state_dict(network), Path(path))


def load_adapter_weights(network: torch.nn.Module, path: Path) -> None:
    """Load what save_adapter_weights wrote into a network that has the same adapter."""
    loaded = load_tensors(Path(path))  # refuses damaged and non-finite files
    if lycoris_of(network) is not None:
        load_lycoris_state(network, loaded, Path(path))
        return
    expected = set(get_peft_model_state_dict(network))
    if set(loaded) != expected:
        missing, extra = sorted(expected - set(loaded)), sorted(set(loaded) - expected)
        raise ValueError(f"{path} does not fit this run's LoRA adapter ({len(missing)} weights "
                         f"missing, e.g. {missing[:1]}; {len(extra)} unexpected, e.g. "
                         f"{extra[:1]}); was it saved with other lora_rank or "
                         "lora_target_modules?")
    set_peft_model_state_dict(network, loaded)


def lora_file_class(adapter_class) -> type:
    """The class that writes and reads the family's LoRA files: its pipeline class, unless
    the adapter names another (a pipeline that diffusers gives no LoRA loader)."""
    return adapter_class.lora_file_class or adapter_class.pipeline_class


def load_lora_file(adapter_class, pipeline, path, adapter_name: str | None = None) -> None:
    """Put the LoRA file (or folder) at ``path`` on ``pipeline``'s trainable network, as
    diffusers' load_lora_weights does: through the family's lora_file_class where it has one,
    else the pipeline's loader, else its network's load_lora_adapter, else (a network without
    diffusers' peft support) peft's own injection."""
    component = adapter_class.trainable_component
    network = getattr(pipeline, component)
    path = Path(path)
    folder, name = (path, LORA_WEIGHTS) if path.is_dir() else (path.parent, path.name)
    loader = adapter_class.lora_file_class
    if loader is not None:
        state, metadata = loader.lora_state_dict(str(path), return_lora_metadata=True)
        loader.load_lora_into_transformer(state, transformer=network,
                                          adapter_name=adapter_name, metadata=metadata)
    elif hasattr(pipeline, "load_lora_weights"):
        pipeline.load_lora_weights(str(path), adapter_name=adapter_name)
    elif hasattr(network, "load_lora_adapter"):
        network.load_lora_adapter(str(folder), weight_name=name, prefix=component,
                                  adapter_name=adapter_name)
    else:
        load_peft_lora_file(network, folder / name, component)


def export_lora(adapter_class, network: torch.nn.Module, output_dir: Path,
                lora_format: str = "diffusers") -> Path:
    """Write output_dir/lora/pytorch_lora_weights.safetensors with the pipeline class's
    save_lora_weights (adapter config recorded as metadata, so lora_alpha survives), so that
    ``pipeline.load_lora_weights(output_dir / "lora")`` puts the adapter on the base model;
    lora_format 'comfyui': in the family's ComfyUI layout (lora_formats.py), which that call
    converts back. The file appears complete or not at all; returns its path."""
    component = adapter_class.trainable_component
    final_dir = Path(output_dir) / LORA_DIR
    final_dir.mkdir(parents=True, exist_ok=True)
    if lora_format == "comfyui":
        return write_comfyui_lora(adapter_class.family, network, final_dir / LORA_WEIGHTS)
    if not hasattr(network, "add_adapter"):  # peft's own injection (inject_lora)
        return write_lora_file(component, network, final_dir / LORA_WEIGHTS)
    staging = staging_folder(final_dir, ".lora-")
    try:
        state, config = adapter_state_dict(network), network.peft_config["default"].to_dict()
        with naming_path(final_dir / LORA_WEIGHTS):  # a full disk is named, not only its errno
            writer = lora_file_class(adapter_class)
            if hasattr(writer, "save_lora_weights"):
                writer.save_lora_weights(
                    staging, safe_serialization=True, weight_name=LORA_WEIGHTS,
                    **{f"{component}_lora_layers": state,
                       f"{component}_lora_adapter_metadata": config})
            else:  # no LoRA loader, a network with peft support (LongCat-Image)
                # Imported here: diffusers' loaders pull in its models (seconds), which the
                # processes that only shard or checkpoint a network need not pay for.
                from diffusers.loaders.lora_base import LoraBaseMixin

                LoraBaseMixin._save_lora_weights(
                    staging, lora_layers={component: state}, lora_metadata={component: config},
                    weight_name=LORA_WEIGHTS, safe_serialization=True)
        give_umask_modes(staging)
        os.replace(staging / LORA_WEIGHTS, final_dir / LORA_WEIGHTS)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final_dir / LORA_WEIGHTS


def write_lora_file(component: str, network: torch.nn.Module, path: Path) -> Path:
    """The adapter as save_lora_weights writes it (``component``. before peft's key names, the
    adapter config as metadata), for a network diffusers gives no peft methods;
    load_peft_lora_file puts it on that pipeline's network."""
    config = network.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    tensors = {f"{component}.{name}": tensor
               for name, tensor in adapter_state_dict(network).items()}
    return write_adapter_file(path, tensors, {LORA_CONFIG_KEY: json.dumps(config)})


def load_peft_lora_file(network: torch.nn.Module, path: Path, component: str) -> None:
    """What write_lora_file wrote, injected into ``network`` (a pipeline's ``component``) as
    the adapter "default" and loaded: ``load_peft_lora_file(pipeline.transformer, folder /
    "pytorch_lora_weights.safetensors", "transformer")``."""
    with safe_open(str(path), framework="pt") as handle:
        config = json.loads(handle.metadata()[LORA_CONFIG_KEY])
        prefix = f"{component}."
        state = {key[len(prefix):]: handle.get_tensor(key) for key in handle.keys()
                 if key.startswith(prefix)}
    inject_lora(network, LoraConfig(**{k: v for k, v in config.items()
                                       if k in LoraConfig.__dataclass_fields__}))
    set_peft_model_state_dict(network, state)
