"""Host tensors onto the accelerator without making the host wait for it: the one place the
per-step path copies from host to device (the batch, noise, timesteps, sigmas, SDXL time ids).

A copy from ordinary (pageable) host memory to CUDA returns only once the device has caught up
with its stream, so one such copy per micro-batch lets the device run dry while the host waits.
From page-locked memory the copy is queued non-blocking and the host goes on; PyTorch's caching
host allocator keeps a pinned block alive until the copy reading it has completed, so the host
tensor may be dropped at once. For a CPU target nothing is copied: the tensor itself comes back.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from simpletuner.models.training_batch import TrainingBatch


def _host_to_cuda(tensor: torch.Tensor, device: torch.device) -> bool:
    return device.type == "cuda" and tensor.device.type == "cpu"


def pinned_for(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` in page-locked memory when it is going to CUDA; else ``tensor`` itself."""
    if _host_to_cuda(tensor, torch.device(device)):
        return tensor.pin_memory()  # an already pinned tensor is returned as it is
    return tensor


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``: from the host to CUDA a non-blocking copy from pinned memory;
    ``tensor`` itself when it is there already (a CPU tensor for a CPU target)."""
    device = torch.device(device)
    if _host_to_cuda(tensor, device):
        return pinned_for(tensor, device).to(device, non_blocking=True)
    return tensor.to(device)


def _optional(move, tensor: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if tensor is None else move(tensor, device)


def batch_pinned_for(batch: TrainingBatch, device: torch.device | str) -> TrainingBatch:
    """The batch's tensors in page-locked memory when they are going to CUDA (the prefetch
    worker does this, so the loop's thread only queues the copies)."""
    return replace(batch, latents=pinned_for(batch.latents, device),
                   prompt_embeds={k: pinned_for(v, device) for k, v in batch.prompt_embeds.items()},
                   reference_latents=tuple(pinned_for(r, device)
                                           for r in batch.reference_latents),
                   conditioning={k: pinned_for(v, device) for k, v in batch.conditioning.items()},
                   loss_mask=_optional(pinned_for, batch.loss_mask, device),
                   control=_optional(pinned_for, batch.control, device))


def batch_to_device(batch: TrainingBatch, device: torch.device | str) -> TrainingBatch:
    """The batch's tensors on ``device`` (see to_device); copies are queued on the current
    stream, so call it from the thread that runs the model."""
    return replace(batch, latents=to_device(batch.latents, device),
                   prompt_embeds={k: to_device(v, device) for k, v in batch.prompt_embeds.items()},
                   reference_latents=tuple(to_device(r, device)
                                           for r in batch.reference_latents),
                   conditioning={k: to_device(v, device) for k, v in batch.conditioning.items()},
                   loss_mask=_optional(to_device, batch.loss_mask, device),
                   control=_optional(to_device, batch.control, device))


def to_device_except(module: torch.nn.Module, device: torch.device,
                     kept: list[torch.nn.Module]) -> torch.nn.Module:
    """``module`` moved to ``device`` as Module.to moves it, except the submodules in ``kept``,
    which stay where they are (block swap's host blocks)."""
    kept_ids = {id(m) for m in kept}
    if id(module) in kept_ids:
        return module
    if not any(id(m) in kept_ids for m in module.modules()):
        return module.to(device)
    module._apply(lambda tensor: tensor.to(device), recurse=False)  # its own tensors only
    for child in module.children():
        to_device_except(child, device, kept)
    return module
