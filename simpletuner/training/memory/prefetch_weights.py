"""A block's weights copied from the host to the training device ahead of its forward, and the
link that sends a trained weight's gradient back to the host (block_swap.py uses both).

On CUDA the copy is queued on a side stream from page-locked memory, so it overlaps the block
that runs meanwhile; the block's stream waits for it only when the block starts. Elsewhere (the
CPU) the copy is made at once. Either way it is a real copy: the block computes with it, never
with the host tensor, so the CPU runs the same path the GPU does."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (module, "_parameters" or "_buffers", name): where one tensor of a block is registered
Slot = tuple[torch.nn.Module, str, str]


def block_slots(block: torch.nn.Module) -> list[Slot]:
    """Every parameter and buffer of ``block``, read now (a LoRA added later is included)."""
    return [(module, kind, name) for module in block.modules()
            for kind in ("_parameters", "_buffers")
            for name, tensor in getattr(module, kind).items() if tensor is not None]


def slot_tensor(slot: Slot) -> torch.Tensor:
    module, kind, name = slot
    return getattr(module, kind)[name]


class HostToDevice(torch.autograd.Function):
    """The device copy of a host parameter as autograd sees it: forward is the copy staged
    ahead of time, backward returns the gradient to the parameter's own (host) device."""

    @staticmethod
    def forward(ctx, host: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
        ctx.host_device = host.device
        return staged.view_as(staged)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.host_device), None


@dataclass
class StagedBlock:
    """Device copies of one block's tensors, in block_slots order; ``ready`` is the side
    stream's event after the copies (None: they are complete)."""

    index: int
    slots: list[Slot]
    copies: list[torch.Tensor]
    ready: torch.cuda.Event | None

    def wait(self) -> None:
        """Make the current stream wait for the copies; the allocator then keeps each copy
        until the current stream is done with it."""
        if self.ready is None:
            return
        stream = torch.cuda.current_stream(self.copies[0].device)
        stream.wait_event(self.ready)
        for copy in self.copies:
            copy.record_stream(stream)


class WeightStager:
    """Copies blocks' tensors to ``device``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def stage(self, index: int, block: torch.nn.Module) -> StagedBlock:
        slots = block_slots(block)
        tensors = [slot_tensor(slot).detach() for slot in slots]
        if self.stream is None:
            return StagedBlock(index, slots, [t.to(self.device, copy=True) for t in tensors], None)
        # The side stream must not read host memory the main stream is still writing.
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            copies = [t.to(self.device, non_blocking=True) for t in tensors]
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return StagedBlock(index, slots, copies, ready)


def pin_block(block: torch.nn.Module) -> None:
    """The block's plain tensors in page-locked memory, so copies to CUDA need not wait for
    the host (quantized tensor subclasses stay as they are)."""
    for module, kind, name in block_slots(block):
        tensor = getattr(module, kind)[name]
        if type(tensor) in (torch.Tensor, torch.nn.Parameter) and not tensor.is_pinned():
            tensor.data = tensor.data.pin_memory()
