"""Evaluation loss: the training loss on the ``eval`` datasets, every ``eval_steps_interval``.

The same number whenever the weights are the same: every evaluation walks epoch 0 of the
evaluation sampler (one sample per rank per micro-batch, nothing trimmed twice differently) and
draws noise and timesteps from generators seeded by (seed, rank, micro-batch), with the network
in eval mode and no gradients. It touches neither the training sampler nor any global RNG, so a
run with evaluation on trains exactly as one without, and a resumed run's evaluations equal the
uninterrupted run's. Every rank takes part (one all-reduce); the main rank logs the mean.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from simpletuner.helpers.metadata.permutation import stable_seed
from simpletuner.helpers.metadata.startup import build_sampler

logger = logging.getLogger(__name__)

EVAL_LOG = "eval_loss.jsonl"


def _generator(seed: int, rank: int, index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(
        stable_seed("eval", seed, rank, index) & (2**63 - 1))


class Evaluator:
    def __init__(self, sampler, assembler, adapter, network: torch.nn.Module, *, seed: int,
                 interval: int, accelerator, output_dir: Path):
        """``sampler``: a MultiAspectSampler over the eval datasets; ``network``: the unwrapped
        trainable module (no DDP hooks: evaluation runs no backward)."""
        self.sampler, self.assembler, self.adapter = sampler, assembler, adapter
        self.network, self.seed, self.interval = network, seed, interval
        self.accelerator = accelerator
        self.log_path = Path(output_dir) / EVAL_LOG

    def is_due(self, step: int) -> bool:
        return step % self.interval == 0

    @torch.no_grad()
    def loss(self) -> float:
        """The mean loss over every evaluation sample (all ranks), for the current weights."""
        rank = self.accelerator.process_index
        total = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)
        was_training = self.network.training
        self.network.eval()
        try:
            for index in range(len(self.sampler)):
                micro_batch = self.sampler.micro_batch(0, index)
                batch = self.assembler(micro_batch)
                with self.accelerator.autocast():
                    loss = self.adapter.compute_loss(batch, _generator(self.seed, rank, index),
                                                     network=self.network)
                total[0] += loss.double() * len(micro_batch.samples)
                total[1] += len(micro_batch.samples)
        finally:
            self.network.train(was_training)
        total = self.accelerator.reduce(total, reduction="sum")
        return float(total[0] / total[1])

    def run(self, step: int) -> float:
        value = self.loss()
        if self.accelerator.is_main_process:
            self.accelerator.log({"eval/loss": value}, step=step)
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(json.dumps({"step": step, "eval_loss": value}) + "\n")
            logger.info("eval loss at step %d: %.6f", step, value)
        return value


def build_evaluator(training, startup, caches, adapter, network: torch.nn.Module,
                    accelerator) -> Evaluator | None:
    """The run's evaluator, or None when eval_steps_interval is 0. ``startup`` and ``caches``
    are what start_data and prepare_caches returned (the eval datasets are cached with the rest)."""
    if not training.eval_steps_interval:
        return None
    sampler = build_sampler(startup, training, accelerator, indexes=caches.indexes,
                            evaluation=True)
    return Evaluator(sampler, caches.assembler, adapter, network, seed=startup.seed,
                     interval=training.eval_steps_interval, accelerator=accelerator,
                     output_dir=Path(training.output_dir))
