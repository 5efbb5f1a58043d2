"""The memory model: the bytes one rank holds on the training device, as the trainer sets the
run up (recipe.py), from the config and the model folder's configs only. Every network is built
on the meta device, so no weight is read and nothing is allocated.

Two moments are counted. While the caches are built: the whole network as loaded (float32 for
full training; for a LoRA the base cast to the mixed_precision dtype and quantized as
``base_model_precision``, the adapter beside it), the VAE and the text encoders (quantized as
``text_encoder_<n>_precision``). FSDP2 shards only after that, so every rank holds it all.
While training: the trainable parameters in the dtype build_optimizer gives them, their
gradients, the optimizer's state (optimizer_bytes.py), the float32 EMA, the frozen network,
and the VAE and text encoders only if ``frozen_components_after_caching`` is "keep" and
group offload is off (under it they are on the host, a group at a time on the device). FSDP2
shards every parameter of the network on dim 0, and with it gradients, state and EMA; buffers,
the VAE and the text encoders are replicated. At both moments: a frozen network beside the
trained one (Wan 2.2 A14B's other expert), in the mixed_precision dtype, replicated.

Not counted here: activations (activations.py; fitting.py adds them and block swap), the
blocks FSDP2 gathers while they run, DDP's gradient buckets, the CUDA context and allocator
overhead."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from simpletuner.training.memory.meta_network import meta_network, network_class
from simpletuner.training.memory.optimizer_bytes import Trained, optimizer_state_bytes
from simpletuner.training.memory.shards import WHOLE, RankPart
from simpletuner.training.memory.weight_bytes import dtype_name, frozen_bytes
from simpletuner.training.optimization.optimizers import (
    OPTIMIZERS, optimizer_arguments, parse_optimizer_config, trained_dtype,
)
from simpletuner.training.preflight import weight_dtype
from simpletuner.training.settings import OptimizerSettings

FLOAT32 = torch.float32


def _add(into: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    total = defaultdict(int, into)
    for key, value in more.items():
        total[key] += value
    return dict(total)


@dataclass
class RankBytes:
    """What one rank holds; each dict maps a storage (dtype name or quantized precision) to
    bytes."""

    network_while_caching: dict[str, int]
    trainable: dict[str, int]
    frozen: dict[str, int]  # the network's frozen parameters and its buffers
    gradients: int
    optimizer: int
    ema: int
    frozen_components: dict[str, int]  # VAE and text encoders
    components_stay: bool  # frozen_components_after_caching is "keep"
    # Frozen networks beside the trained one, replicated, always on the device (Wan 2.2
    # A14B's other expert).
    other_networks: dict[str, int] = field(default_factory=dict)

    @property
    def while_caching(self) -> int:
        return (sum(self.network_while_caching.values()) + sum(self.frozen_components.values())
                + sum(self.other_networks.values()))

    @property
    def while_training(self) -> int:
        components = sum(self.frozen_components.values()) if self.components_stay else 0
        return (sum(self.trainable.values()) + sum(self.frozen.values()) + self.gradients
                + self.optimizer + self.ema + components + sum(self.other_networks.values()))

    @property
    def peak(self) -> int:
        return max(self.while_caching, self.while_training)


def frozen_component_bytes(adapter_class, folder: Path, training) -> dict[str, int]:
    """The VAE's and the text encoders' bytes on the device as the trainer loads them
    (mixed_precision's dtype; SDXL's VAE stays float32 under fp16) and quantizes the encoders.
    Under group offload they live on the host: block_level brings a text encoder whole for its
    forward (the VAE by parts), so the largest component counts; leaf_level brings one layer
    at a time, not counted."""
    dtype = weight_dtype(training.mixed_precision)
    vae_dtype = (FLOAT32 if getattr(adapter_class, "vae_float32_under_fp16", False)
                 and dtype == torch.float16 else dtype)
    with torch.device("meta"):
        vae_class = adapter_class.vae_class
        vae = vae_class.from_config(vae_class.load_config(folder / "vae"))
        parts = [frozen_bytes(vae.requires_grad_(False), "no_change", vae_dtype)]
        for number, (encoder_folder, _, encoder_class, _) in enumerate(
                adapter_class.text_encoder_specs, start=1):
            encoder = encoder_class(encoder_class.config_class.from_pretrained(
                folder / encoder_folder)).requires_grad_(False)
            precision = getattr(training, f"text_encoder_{number}_precision")
            parts.append(frozen_bytes(encoder, precision, dtype))
    if not training.enable_group_offload:
        held = {}
        for part in parts:
            held = _add(held, part)
        return held
    if training.group_offload_type == "leaf_level":
        return {}
    return max(parts, key=lambda part: sum(part.values()))


def other_network_bytes(adapter_class, folder: Path, training) -> dict[str, int]:
    """The frozen network of ``adapter_class.other_network_folder`` (if it has one) as the
    trainer loads it: mixed_precision's dtype, not quantized."""
    subfolder = getattr(adapter_class, "other_network_folder", None)
    if subfolder is None:
        return {}
    cls = network_class(adapter_class)
    with torch.device("meta"):
        network = cls.from_config(cls.load_config(folder / subfolder)).requires_grad_(False)
    return frozen_bytes(network, "no_change", weight_dtype(training.mixed_precision))


def state_arguments(training) -> dict:
    """The optimizer's keyword arguments as build_optimizer passes them; planning on a machine
    without the optimizer's library, the config's own values."""
    spec = OPTIMIZERS[training.optimizer]
    if spec.module is None or importlib.util.find_spec(spec.module) is not None:
        return optimizer_arguments(OptimizerSettings.from_config(training))
    return {"betas": (training.adam_beta1, training.adam_beta2), **dict(spec.fixed),
            **parse_optimizer_config(training.optimizer_config)}


def _frozen_dtype(training) -> torch.dtype:
    """A LoRA's base is cast to mixed_precision's dtype; a full run's network stays float32."""
    return weight_dtype(training.mixed_precision) if training.model_type == "lora" else FLOAT32


def caching_network_bytes(network: torch.nn.Module, training) -> dict[str, int]:
    """The whole network while the caches are built: as loaded, before FSDP2 shards it; the
    LoRA in its base's dtype (peft follows the base layer)."""
    dtype = _frozen_dtype(training)
    trainable = sum(p.numel() for p in network.parameters() if p.requires_grad)
    return _add(frozen_bytes(network, training.base_model_precision, dtype),
                {dtype_name(dtype): trainable * dtype.itemsize})


def trained_parameters(network: torch.nn.Module, training, part: RankPart) -> list[Trained]:
    dtype = trained_dtype(training.optimizer)
    # add_lora starts every B at zero
    return [Trained(tuple(p.shape), dtype, starts_at_zero=".lora_B." in name, part=part)
            for name, p in network.named_parameters() if p.requires_grad]


def rank_bytes(network: torch.nn.Module, training, part: RankPart,
               frozen_components: dict[str, int]) -> RankBytes:
    """Everything rank ``part.rank`` holds for ``network`` (on the meta device, a LoRA added
    when the config trains one) under the config ``training``."""
    trained = trained_parameters(network, training, part)
    trainable = sum(p.bytes for p in trained)
    frozen = frozen_bytes(network, training.base_model_precision, _frozen_dtype(training), part)
    return RankBytes(
        network_while_caching=caching_network_bytes(network, training),
        trainable={dtype_name(trained_dtype(training.optimizer)): trainable} if trained else {},
        frozen=frozen, gradients=trainable,
        optimizer=optimizer_state_bytes(training.optimizer, trained, state_arguments(training)),
        ema=sum(p.numel for p in trained) * FLOAT32.itemsize if training.use_ema else 0,
        frozen_components=frozen_components,
        components_stay=(training.frozen_components_after_caching == "keep"
                         and not training.enable_group_offload))


def fsdp_refusal(training) -> str | None:
    """Why the trainer cannot run this config under FSDP2 (so there is nothing to plan), or
    None."""
    if training.model_type == "lora" and training.base_model_precision != "no_change":
        return (f"base_model_precision {training.base_model_precision}: fully_shard does not "
                "shard quantized weights (torchao's fail, optimum-quanto's become float)")
    if training.optimizer == "adafactor":
        return "optimizer adafactor: torch's Adafactor fails on sharded (DTensor) gradients"
    return None


@dataclass
class MemoryPlan:
    ddp: RankBytes
    fsdp: list[RankBytes] | None  # one per rank; None when fsdp_refusal says why
    fsdp_refusal: str | None
    parameters: int  # of the trained network, a LoRA included
    trainable_parameters: int


def memory_plan(training, model_folder: Path, world: int) -> MemoryPlan:
    """Per rank at ``world`` processes, under DDP and under FSDP2."""
    from simpletuner.models.registry import get_adapter_class
    adapter_class = get_adapter_class(training.model_family).for_folder(model_folder)
    network = meta_network(adapter_class, model_folder, training)
    components = frozen_component_bytes(adapter_class, model_folder, training)
    others = other_network_bytes(adapter_class, model_folder, training)
    refusal = fsdp_refusal(training)
    fsdp = None if refusal else [
        replace(rank_bytes(network, training, RankPart(rank, world, sharded=True), components),
                other_networks=others) for rank in range(world)]
    return MemoryPlan(ddp=replace(rank_bytes(network, training, WHOLE, components),
                                  other_networks=others), fsdp=fsdp,
                      fsdp_refusal=refusal,
                      parameters=sum(p.numel() for p in network.parameters()),
                      trainable_parameters=sum(p.numel() for p in network.parameters()
                                               if p.requires_grad))
