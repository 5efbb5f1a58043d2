"""Evaluation sets smaller than (or not a multiple of) the number of processes, every rank
simulated in one process: each rank makes the same number of forward passes, and the loss
is the mean over the real samples, stand-ins left out of both the sum and the count."""

from __future__ import annotations

import contextlib
import unittest

import torch

from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset
from simpletuner.training.reporting.evaluation import Evaluator
from simpletuner.training.settings import EvaluationSettings


class SampleLoss:
    """A model whose loss is fixed per sample, counting its forward passes."""

    def __init__(self, losses: dict[str, float]):
        self.losses, self.calls = losses, 0

    def compute_loss(self, batch, generator, network):
        self.calls += 1
        (sample,) = batch.samples
        return torch.tensor(self.losses[sample.sample_id])


class OneRank:
    """What the evaluator asks of accelerate's Accelerator, for one simulated rank."""

    def __init__(self, rank: int):
        self.process_index, self.device = rank, torch.device("cpu")
        self.is_main_process = rank == 0

    def autocast(self):
        return contextlib.nullcontext()


def rank_totals(losses: dict[str, float], buckets: dict[str, list[str]], world: int):
    """Per rank: (loss sum, count, forward passes)."""
    held = SamplerDataset(DatasetIndex("held", buckets, {}), str, 4, evaluation=True)
    found = []
    for rank in range(world):
        sampler = MultiAspectSampler([held], seed=2, processes=world, rank=rank,
                                     accumulation=3, evaluation=True)
        model = SampleLoss(losses)
        evaluator = Evaluator(sampler, lambda micro_batch: micro_batch, model,
                              torch.nn.Linear(1, 1), seed=2,
                              settings=EvaluationSettings(eval_steps_interval=1),
                              accelerator=OneRank(rank))
        total = evaluator.local_totals()
        found.append((float(total[0]), int(total[1]), model.calls))
    return found


class UnevenEvaluationTest(unittest.TestCase):
    def test_two_images_on_eight_processes(self):
        losses = {"a.png": 1.0, "b.png": 4.0}
        found = rank_totals(losses, {"64x64": ["a.png", "b.png"]}, 8)
        self.assertEqual([calls for *_, calls in found], [1] * 8)  # every rank runs one step
        self.assertEqual(sum(count for _, count, _ in found), 2)
        self.assertEqual(sum(loss for loss, *_ in found), 5.0)  # mean 2.5 over the 2 images

    def test_any_size_on_any_number_of_processes(self):
        for world in range(1, 9):
            for n in range(1, 2 * world + 2):
                names = [f"{i:02d}.png" for i in range(n)]
                losses = {name: float(i + 1) for i, name in enumerate(names)}
                buckets = {"64x64": names[::2], "64x128": names[1::2]} if n > 1 else {
                    "64x64": names}
                with self.subTest(world=world, n=n):
                    found = rank_totals(losses, buckets, world)
                    self.assertEqual(len({calls for *_, calls in found}), 1)
                    self.assertEqual(sum(count for _, count, _ in found), n)
                    self.assertEqual(sum(loss for loss, *_ in found), n * (n + 1) / 2)


if __name__ == "__main__":
    unittest.main()
