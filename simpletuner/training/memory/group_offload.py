"""enable_group_offload for a run: the VAE and text encoders, loaded and quantized on the CPU,
go under diffusers' group-offloading hooks (models/group_offload.py) before anything is placed
on the device, so latent caching, text-embedding caching and validation bring each group of
their layers to the device for its own forward. The trained network is not hooked: training
needs its weights through the backward and the optimizer step, which block swap
(musubi_blocks_to_swap) provides.

With group_offload_to_disk_path each rank writes its text encoders' weights under
``<path>/<run>-rank<r>/<component>``, emptied first: diffusers reads whatever file it finds
under a group's name, so one left by another model must never be read. ``<run>`` comes from
output_dir, which one run at a time holds. The VAE (a few hundred MB) stays in host memory:
on disk, a tensor read outside any forward (FLUX.2's latent batch-norm statistics, which its
pipeline reads directly) would be an empty placeholder."""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

import torch

from simpletuner.models.group_offload import offload_groups, untie_shared_parameters
from simpletuner.training.settings import GroupOffloadSettings

logger = logging.getLogger(__name__)


def frozen_components(adapter) -> dict[str, torch.nn.Module]:
    """The VAE and text encoders under their pipeline component names."""
    encoders = {("text_encoder" if number == 1 else f"text_encoder_{number}"): encoder
                for number, encoder in enumerate(adapter.text_encoders, start=1)}
    return {"vae": adapter.vae, **encoders}


def rank_folder(settings: GroupOffloadSettings, rank: int) -> Path | None:
    """This rank's folder under group_offload_to_disk_path; None: host memory."""
    if settings.group_offload_to_disk_path is None:
        return None
    run = hashlib.sha256(str(Path(settings.output_dir).resolve()).encode()).hexdigest()[:12]
    return Path(settings.group_offload_to_disk_path) / f"{run}-rank{rank}"


def offload_frozen_components(adapter, settings: GroupOffloadSettings, device: torch.device,
                              rank: int) -> list[str]:
    """Hook the adapter's VAE and text encoders (still on the host) when enable_group_offload
    is set; the names of the components hooked."""
    if not settings.enable_group_offload:
        return []
    root = rank_folder(settings, rank)
    components = frozen_components(adapter)
    for name, module in components.items():
        folder = None if root is None or name == "vae" else root / name
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            untie_shared_parameters(module)  # else a tied weight is saved emptied
        offload_groups(module, onload_device=device, offload_type=settings.group_offload_type,
                       blocks_per_group=settings.group_offload_blocks_per_group,
                       use_stream=settings.group_offload_use_stream, disk_folder=folder)
    logger.info("group offload (%s): %s held on the host%s, each group brought to %s for its "
                "forward", settings.group_offload_type, ", ".join(components),
                "" if root is None else f", the text encoders' weights in {root}", device)
    return list(components)
