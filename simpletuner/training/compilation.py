"""``dynamo_backend``: regional compilation. Each repeated block of the trained network (the
blocks block swap and FSDP2 also work with, or the classes diffusers' ``_repeated_blocks``
names: the UNet's transformer blocks) is compiled in place with ``torch.compile``, as
diffusers' ``compile_repeated_blocks`` and torchtitan do, never the whole network: blocks of one
class share their compiled code, so compiling costs one block per class, and the state dict,
LoRA layers and checkpointing function stay those of the eager network.

Compiling happens during the first steps (and again for a new shape, or for validation's
no-grad forward); ``CompileClock`` tells how long of each step it took, so the progress and
the event log show it as compile time, not training time."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

EAGER = "no"
# torch's compile-time records (seconds per compilation): the forward's frames, the backward's.
_COMPILE_RECORDS = ("_compile.compile_inner", "backward._backward_impl")


def repeated_blocks(adapter) -> list[torch.nn.Module]:
    network = adapter.trainable
    blocks = type(adapter).swappable_blocks(network)
    names = getattr(network, "_repeated_blocks", ())
    return blocks or [module for module in network.modules() if type(module).__name__ in names]


def compile_repeated_blocks(adapter, backend: str) -> int:
    """Each repeated block compiled in place with ``backend``; how many (0 for 'no')."""
    if backend == EAGER:
        return 0
    blocks = repeated_blocks(adapter)
    if not blocks:
        raise ValueError(f"dynamo_backend '{backend}': {type(adapter.trainable).__name__} has no "
                         "repeated blocks to compile; set dynamo_backend to 'no'")
    for block in blocks:
        block.compile(backend=backend)
    logger.info("dynamo_backend %s: %d repeated blocks compiled in place (%s); the first steps "
                "include their compilation", backend, len(blocks),
                ", ".join(sorted({type(block).__name__ for block in blocks})))
    return len(blocks)


def compiled_seconds() -> float:
    """Seconds this process has spent compiling with torch.compile so far."""
    from torch._dynamo.utils import compilation_time_metrics
    return sum(sum(compilation_time_metrics.get(name, ())) for name in _COMPILE_RECORDS)


class CompileClock:
    """Compile time between one ``take`` and the next."""

    def __init__(self):
        self.seen = compiled_seconds()

    def take(self) -> float:
        now = compiled_seconds()
        spent, self.seen = now - self.seen, now
        return spent
