"""Block swap (SimpleTuner's ``musubi_blocks_to_swap``): the last N of the network's repeated
blocks live on the host (``musubi_block_swap_device``), with their weights, gradients and
optimizer state, and are copied to the training device for each forward, the recomputing one
in the backward included (gradient checkpointing is required: without it autograd would keep
every copy until the backward, and nothing would be saved).

While swapped block k runs, the next one is copied on a side stream (prefetch_weights.py):
block k+1 in the forward, block k-1 in the backward, told apart by the order the blocks run.
A frozen weight (a LoRA's base) only ever travels to the device; a trained one sends its
gradient back to the host, where the optimizer steps it. A wrong guess costs a wait, never a
different result: a block always computes with copies of its current host tensors."""

from __future__ import annotations

import logging

import torch

from simpletuner.models.transfer import to_device_except
from simpletuner.training.memory.prefetch_weights import (HostToDevice, StagedBlock,
                                                          WeightStager, pin_block, slot_tensor)
from simpletuner.training.settings import BlockSwapSettings

logger = logging.getLogger(__name__)


class BlockSwapError(ValueError):
    """musubi_blocks_to_swap does not fit this network."""


class BlockSwap:
    """The hooks that bring ``host_blocks`` (in the order the forward runs them) to
    ``device``; ``before`` is the resident block that runs just before the first of them."""

    def __init__(self, host_blocks: list[torch.nn.Module], before: torch.nn.Module | None,
                 device: torch.device):
        self.host_blocks = host_blocks
        self.stager = WeightStager(device)
        self.prefetched: StagedBlock | None = None
        self.last_index: int | None = None
        self.originals: dict[int, tuple[list, list[torch.Tensor]]] = {}  # slots, host tensors
        for index, block in enumerate(host_blocks):
            block.register_forward_pre_hook(lambda *_, i=index: self._bring(i))
            block.register_forward_hook(lambda *_, i=index: self._restore(i), always_call=True)
        if before is not None:
            before.register_forward_pre_hook(lambda *_: self._start())

    def _start(self) -> None:
        """The forward reached the last resident block: the first host block comes next."""
        self.last_index = -1
        self._prefetch(0)

    def _prefetch(self, index: int) -> None:
        if 0 <= index < len(self.host_blocks):
            self.prefetched = self.stager.stage(index, self.host_blocks[index])
        else:
            self.prefetched = None

    def _take(self, index: int) -> StagedBlock:
        staged, self.prefetched = self.prefetched, None
        if staged is None or staged.index != index:
            staged = self.stager.stage(index, self.host_blocks[index])
        return staged

    def _bring(self, index: int) -> None:
        """Before block ``index`` runs: its tensors replaced by their device copies."""
        staged = self._take(index)
        forward = self.last_index is None or index > self.last_index
        self.last_index = index
        self._prefetch(index + 1 if forward else index - 1)
        staged.wait()
        grad = torch.is_grad_enabled()
        originals = [slot_tensor(slot) for slot in staged.slots]
        self.originals[index] = (staged.slots, originals)
        for (module, kind, name), original, copy in zip(staged.slots, originals, staged.copies):
            trained = grad and kind == "_parameters" and original.requires_grad
            getattr(module, kind)[name] = HostToDevice.apply(original, copy) if trained else copy

    def _restore(self, index: int) -> None:
        """After block ``index`` (also when it raised): its own host tensors back in place;
        the copies live on only as long as autograd needs them."""
        slots, originals = self.originals.pop(index, ((), ()))
        for (module, kind, name), original in zip(slots, originals):
            getattr(module, kind)[name] = original


def swapped_blocks(adapter, count: int) -> tuple[list[torch.nn.Module], torch.nn.Module | None]:
    """The last ``count`` of the adapter's swappable blocks and the block before them."""
    blocks = adapter.swappable_blocks(adapter.trainable)
    if count > len(blocks):
        raise BlockSwapError(
            f"musubi_blocks_to_swap is {count}, but {type(adapter.trainable).__name__} has "
            f"{len(blocks)} blocks; set it to {len(blocks)} or less")
    before = blocks[-count - 1] if count < len(blocks) else None
    return blocks[-count:], before


def place_network(adapter, settings: BlockSwapSettings, device: torch.device) -> BlockSwap | None:
    """The adapter's parts onto ``device``: all of them, or, with musubi_blocks_to_swap, all
    but the swapped blocks, which stay on the host with the hooks that bring them."""
    count = settings.musubi_blocks_to_swap
    if not count:
        adapter.move_to(device)
        return None
    host_blocks, before = swapped_blocks(adapter, count)
    host = torch.device(settings.musubi_block_swap_device)
    for block in host_blocks:
        block.to(host)
        if device.type == "cuda":
            pin_block(block)
    adapter.move_to(device, except_modules=host_blocks)
    logger.info("block swap: %d of %d blocks live on the %s and are copied to %s for each "
                "forward", count, len(adapter.swappable_blocks(adapter.trainable)), host, device)
    return BlockSwap(host_blocks, before, device)


def network_to_device(network: torch.nn.Module, device: torch.device,
                      swap: BlockSwap | None) -> torch.nn.Module:
    """``network`` on ``device`` (validation), block swap's host blocks left on the host."""
    return to_device_except(network, device, swap.host_blocks if swap else [])
