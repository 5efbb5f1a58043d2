"""Evaluation loss: the training loss on the ``eval`` datasets, every ``eval_steps_interval``.

The same number whenever the weights are the same: every evaluation walks epoch 0 of the
evaluation sampler (one sample per rank per micro-batch, every sample exactly once) and
draws noise and timesteps from generators seeded by (seed, rank, micro-batch), with the network
in eval mode and no gradients. It touches neither the training sampler nor any global RNG, so a
run with evaluation on trains exactly as one without, and a resumed run's evaluations equal the
uninterrupted run's. Every rank runs the same number of micro-batches, whatever the set's size:
a rank whose share ended runs a stand-in (a sample of the same bucket, so a sharded network's
collectives are made on every rank alike) whose loss is left out. One all-reduce of the loss sum
and the count of real samples gives the mean over the set itself; the main rank logs it to the
trackers inside failing_together, so a failed log stops every rank. The trainer records it in
the event log (events.py: an ``eval`` line).
"""

from __future__ import annotations

import logging

import torch

from simpletuner.common.peer_watch import in_collective
from simpletuner.common.together import failing_together
from simpletuner.helpers.metadata.permutation import stable_seed
from simpletuner.training.settings import EvaluationSettings

logger = logging.getLogger(__name__)


def _generator(seed: int, rank: int, index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(
        stable_seed("eval", seed, rank, index) & (2**63 - 1))


class Evaluator:
    def __init__(self, sampler, assembler, adapter, network: torch.nn.Module, *, seed: int,
                 settings: EvaluationSettings, accelerator):
        """``sampler``: a MultiAspectSampler over the eval datasets (built with
        ``evaluation=True``; the eval datasets are cached with the rest); ``network``: the unwrapped
        trainable module (no DDP hooks: evaluation runs no backward). Every rank builds it."""
        self.sampler, self.assembler, self.adapter = sampler, assembler, adapter
        self.network, self.seed, self.interval = network, seed, settings.eval_steps_interval
        self.accelerator = accelerator

    def is_due(self, step: int) -> bool:
        return step % self.interval == 0

    @torch.no_grad()
    def local_totals(self) -> torch.Tensor:
        """This rank's (loss sum, real samples) over its share, stand-ins run but not counted."""
        rank = self.sampler.rank  # the data-parallel group: a context-parallel group's noise
        total = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)
        was_training = self.network.training
        self.network.eval()
        try:
            for index in range(self.sampler.micro_batches_in(0)):
                micro_batch = self.sampler.micro_batch(0, index)
                batch = self.assembler(micro_batch)
                with self.accelerator.autocast():
                    loss = self.adapter.compute_loss(batch, _generator(self.seed, rank, index),
                                                     network=self.network)
                if not micro_batch.stand_in:
                    total[0] += loss.double() * len(micro_batch.samples)
                    total[1] += len(micro_batch.samples)
        finally:
            self.network.train(was_training)
        return total

    def loss(self) -> float:
        """The mean loss over every evaluation sample (all ranks), for the current weights."""
        totals = self.local_totals()
        with in_collective("the evaluation loss's reduce"):
            total = self.accelerator.reduce(totals, reduction="sum")
        return float(total[0] / total[1])

    def run(self, step: int) -> float:
        """Every rank calls it at the same step; returns the mean loss."""
        value = self.loss()
        with failing_together(f"logging the evaluation loss at step {step}"):
            if self.accelerator.is_main_process:
                self.accelerator.log({"eval/loss": value}, step=step)
                logger.info("eval loss at step %d: %.6f", step, value)
        return value

