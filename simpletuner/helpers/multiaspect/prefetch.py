"""Micro-batches assembled ahead of the training loop: while step i trains, one background thread
reads the next micro-batches' latents and text embeddings from the caches, so step i+1's batch
is ready when step i ends.

The sampler is still iterated here, in the loop's thread, one micro-batch per loop iteration, so
its position (what a checkpoint saves) counts the micro-batches the loop consumed, never those
read ahead. The ones ahead come from ``sampler.micro_batch(epoch, step)``, the same pure function
of the position the sampler's own iteration calls; a batch read ahead but not consumed before a
checkpoint is simply assembled again after resume.

Iteration runs across epochs (the caller stops it), so the first batch of an epoch is read while
the last one of the previous epoch trains. It reads into the next epoch only once the sampler has
handed out the current epoch's last micro-batch, so the sampler's per-epoch slice cache is never
switched back and forth.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from simpletuner.helpers.multiaspect.batch import MicroBatch
from simpletuner.helpers.multiaspect.dataset import on_device, pinned
from simpletuner.models.base import TrainingBatch

Assemble = Callable[[MicroBatch], TrainingBatch]


def positions_after(epoch: int, step: int, per_epoch: int, count: int) -> list[tuple[int, int]]:
    """Up to ``count`` (epoch, step) positions that follow ``(epoch, step)``; they enter the next
    epoch only when ``step`` is the last of its epoch."""
    if step + 1 < per_epoch:
        return [(epoch, s) for s in range(step + 1, min(step + 1 + count, per_epoch))]
    return [(epoch + 1, s) for s in range(min(count, per_epoch))]


class PrefetchedBatches:
    """``for micro_batch, batch in PrefetchedBatches(sampler, assembler, device=...)``: the
    sampler's micro-batches in its order, each with its assembled batch, ``depth`` read ahead.

    On CUDA the worker pins the batch's tensors and the loop's thread starts non-blocking copies
    to the device, so neither the read nor the copy makes the host wait for the device. An
    assembly error is raised in the loop, at the micro-batch it belongs to, naming its samples.
    The worker thread ends when the iteration ends (exhausted, broken out of, or raised through).
    """

    def __init__(self, sampler, assemble: Assemble, *, device: torch.device | str = "cpu",
                 depth: int = 2):
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, not {depth}")
        self.sampler = sampler
        self.assemble = assemble
        self.device = torch.device(device)
        self.depth = depth

    def __iter__(self) -> Iterator[tuple[MicroBatch, TrainingBatch]]:
        if len(self.sampler) == 0:
            return
        ahead: deque[tuple[MicroBatch, Future]] = deque()
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch")
        try:
            while True:  # epoch after epoch, until the caller stops
                for micro_batch in self.sampler:
                    future = self._take(ahead, micro_batch, worker)
                    self._read_ahead(ahead, micro_batch, worker)
                    yield micro_batch, self._ready(future.result())
        finally:
            worker.shutdown(wait=True, cancel_futures=True)

    def _take(self, ahead: deque, micro_batch: MicroBatch, worker: ThreadPoolExecutor) -> Future:
        """The batch read ahead for ``micro_batch``, else one submitted now."""
        while ahead:
            queued, future = ahead.popleft()
            if queued == micro_batch:
                return future
            future.cancel()
        return worker.submit(self._prepare, micro_batch)

    def _read_ahead(self, ahead: deque, consumed: MicroBatch, worker: ThreadPoolExecutor) -> None:
        wanted = positions_after(consumed.epoch, consumed.step, len(self.sampler), self.depth)
        for epoch, step in wanted[len(ahead):]:
            micro_batch = self.sampler.micro_batch(epoch, step)
            ahead.append((micro_batch, worker.submit(self._prepare, micro_batch)))

    def _prepare(self, micro_batch: MicroBatch) -> TrainingBatch:
        """In the worker thread: read the caches, and pin the tensors for a CUDA copy."""
        try:
            batch = self.assemble(micro_batch)
        except Exception as error:
            samples = ", ".join(f"{s.dataset_id}/{s.sample_id}" for s in micro_batch.samples)
            error.add_note(f"while assembling micro-batch {micro_batch.step} of epoch "
                           f"{micro_batch.epoch} (bucket {micro_batch.bucket}): {samples}")
            raise
        return pinned(batch) if self.device.type == "cuda" else batch

    def _ready(self, batch: TrainingBatch) -> TrainingBatch:
        """In the loop's thread, so the copy is queued on the stream the model runs on."""
        return on_device(batch, self.device) if self.device.type == "cuda" else batch
