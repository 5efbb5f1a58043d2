"""Micro-batches assembled ahead of the training loop: while step i trains, one background thread
reads the next micro-batches' latents and text embeddings from the caches, so step i+1's batch
is ready when step i ends.

The sampler is still iterated here, in the loop's thread, one micro-batch per loop iteration, so
its position (what a checkpoint saves) counts the micro-batches the loop consumed, never those
read ahead; a batch read ahead but not consumed before a checkpoint is simply assembled again
after resume. The loop's thread only plans (``sampler.plans()``: which samples, no captions);
the worker plans the same positions with a twin sampler (``plan(epoch, step)`` is a pure
function of the position), reads their captions (a pure choice per sample and epoch, see
captions.py) and assembles them, so caption reads leave the loop's thread and the two threads
never share the sampler's unlocked slice cache. Each batch read ahead is checked against the
plan the sampler then hands out, and the loop gets the worker's micro-batch, captions included.

Iteration runs across epochs (the caller stops it), so the first batch of an epoch is read while
the last one of the previous epoch trains.

A batch read ahead is started a few milliseconds after it is asked for, once the step is under
way: between steps the loop's thread runs Python, and a worker that started at once took the
GIL from it at its first blocking call and kept it for its own reads, up to Python's switch
interval, so the loop waited for its data.

The worker runs torch with one intra-op thread (set per thread; the loop's count is untouched):
with the default, stacking an SDXL-sized batch opened a parallel region of its own next to the
model's and oversubscribed the cores, slowing every step. The figures behind both choices are in
benchmarks/PERFORMANCE.md (bench_train.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from simpletuner.helpers.multiaspect.batch import MicroBatch
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.transfer import batch_pinned_for, batch_to_device

Assemble = Callable[[MicroBatch], TrainingBatch]
Prepared = tuple[MicroBatch, TrainingBatch]
READ_AHEAD_START_DELAY_S = 0.003  # see the module docstring; a busy worker does not wait again


def positions_after(epoch: int, step: int, length_of: Callable[[int], int],
                    count: int) -> list[tuple[int, int]]:
    """The ``count`` (epoch, step) positions that follow ``(epoch, step)``, across epochs;
    ``length_of(epoch)``: its micro-batches (bucket_tail carry makes it differ by epoch)."""
    positions = []
    for _ in range(count):
        epoch, step = (epoch, step + 1) if step + 1 < length_of(epoch) else (epoch + 1, 0)
        positions.append((epoch, step))
    return positions


def twin_of(sampler: MultiAspectSampler) -> MultiAspectSampler:
    """A sampler with the same plan and caches of its own, for another thread."""
    return MultiAspectSampler(sampler.datasets, seed=sampler.seed, processes=sampler.processes,
                              rank=sampler.rank, accumulation=sampler.accumulation,
                              evaluation=sampler.evaluation, sampling=sampler.sampling,
                              context_parallel=sampler.context_parallel)


class PrefetchedBatches:
    """``for micro_batch, batch in PrefetchedBatches(sampler, assembler, device=...)``: the
    sampler's micro-batches (as its iteration gives them, captions included) in its order, each
    with its assembled batch, ``depth`` read ahead.

    On CUDA the worker pins the batch's tensors and the loop's thread starts non-blocking copies
    to the device, so neither the read nor the copy makes the host wait for the device. An
    assembly error is raised in the loop, at the micro-batch it belongs to, naming its samples.
    The worker thread ends when the iteration ends (exhausted, broken out of, or raised through).
    """

    def __init__(self, sampler: MultiAspectSampler, assemble: Assemble, *,
                 device: torch.device | str = "cpu", depth: int = 2):
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, not {depth}")
        self.sampler = sampler
        self.assemble = assemble
        self.device = torch.device(device)
        self.depth = depth

    def __iter__(self) -> Iterator[tuple[MicroBatch, TrainingBatch]]:
        if len(self.sampler) == 0:
            return
        twin = twin_of(self.sampler)
        ahead: deque[tuple[tuple[int, int], Future]] = deque()  # (epoch, step), its Prepared
        # One torch thread in the worker: its parallel regions (stacking large latents) on top
        # of the model's compute threads oversubscribed the cores (see the module docstring).
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch",
                                    initializer=torch.set_num_threads, initargs=(1,))
        try:
            while True:  # epoch after epoch, until the caller stops
                for planned in self.sampler.plans():
                    future = self._take(ahead, planned, worker, twin)
                    self._read_ahead(ahead, planned, worker, twin)
                    yield self._ready(planned, future.result())
        finally:
            worker.shutdown(wait=True, cancel_futures=True)

    def _take(self, ahead: deque, planned: MicroBatch, worker: ThreadPoolExecutor,
              twin: MultiAspectSampler) -> Future:
        """The batch read ahead at ``planned``'s position, else one submitted now."""
        position = (planned.epoch, planned.step)
        while ahead:
            ahead_at, future = ahead.popleft()
            if ahead_at == position:
                return future
            future.cancel()
        return worker.submit(self._prepare_at, twin, position, time.monotonic())

    def _read_ahead(self, ahead: deque, consumed: MicroBatch, worker: ThreadPoolExecutor,
                    twin: MultiAspectSampler) -> None:
        wanted = positions_after(consumed.epoch, consumed.step, self.sampler.micro_batches_in,
                                 self.depth)
        for position in wanted[len(ahead):]:
            start = time.monotonic() + READ_AHEAD_START_DELAY_S
            ahead.append((position, worker.submit(self._prepare_at, twin, position, start)))

    def _prepare_at(self, twin: MultiAspectSampler, position: tuple[int, int],
                    start: float) -> Prepared:
        time.sleep(max(0.0, start - time.monotonic()))
        return self._prepare(twin, twin.plan(*position))

    def _prepare(self, twin: MultiAspectSampler, planned: MicroBatch) -> Prepared:
        """In the worker thread: read the captions and the caches, and pin the tensors for a
        CUDA copy."""
        try:
            micro_batch = twin.with_captions(planned)
            batch = self.assemble(micro_batch)
        except Exception as error:
            samples = ", ".join(f"{s.dataset_id}/{s.sample_id}" for s in planned.samples)
            error.add_note(f"while assembling micro-batch {planned.step} of epoch "
                           f"{planned.epoch} (bucket {planned.bucket}): {samples}")
            raise
        return micro_batch, batch_pinned_for(batch, self.device)

    def _ready(self, planned: MicroBatch, prepared: Prepared) -> Prepared:
        """In the loop's thread, so the copy is queued on the stream the model runs on."""
        assembled_for, batch = prepared
        if assembled_for.without_captions() != planned:
            raise RuntimeError(
                f"the batch read ahead for micro-batch {planned.step} of epoch "
                f"{planned.epoch} was planned differently ({assembled_for}) from what the "
                f"sampler handed out ({planned}): the plan is not a function of the position")
        return assembled_for, batch_to_device(batch, self.device)
