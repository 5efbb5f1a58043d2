"""The non-finite guard: the per-step decision over simulated ranks, and a real diverging run
that stops with its own exit status and saves nothing non-finite."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load_file

from accelerate import Accelerator

from simpletuner.training.step_guard import NonFiniteGuard, StepTotals, clip_gradients, pack_step
from training_fixtures import make_shapes, read_events, read_report, run_training, write_config

NAN, INF = float("nan"), float("inf")


def reduced(*ranks: tuple[float, float, bool]) -> StepTotals:
    """What every rank reads after the sum-reduce, for ranks given as (loss sum, grad norm,
    stopping), each over 2 micro-batches."""
    packed = [pack_step(torch.tensor(loss), 2, torch.tensor(norm), stopping)
              for loss, norm, stopping in ranks]
    return StepTotals(*torch.stack(packed).sum(dim=0).tolist())


class StepTotalsTest(unittest.TestCase):
    def test_finite_ranks_give_the_mean_loss_over_every_micro_batch(self):
        totals = reduced((1.0, 0.5, False), (3.0, 0.5, False))
        self.assertTrue(totals.finite)
        self.assertEqual(totals.micro_batches, 4)
        self.assertAlmostEqual(totals.mean_loss, 1.0)
        self.assertEqual(totals.stopping, 0)

    def test_one_non_finite_rank_is_seen_by_all(self):
        self.assertEqual(reduced((NAN, 0.5, False), (1.0, 0.5, False)).nonfinite_loss, 1)
        self.assertEqual(reduced((1.0, INF, False), (1.0, 0.5, False)).nonfinite_grad, 1)
        self.assertFalse(reduced((1.0, 0.5, False), (-INF, NAN, False)).finite)

    def test_one_stopping_rank_is_seen_by_all(self):
        self.assertEqual(reduced((1.0, 0.5, False), (1.0, 0.5, True)).stopping, 1)


class NonFiniteGuardTest(unittest.TestCase):
    def decisions(self, guard: NonFiniteGuard, steps: list[StepTotals]) -> list[bool]:
        return [guard.should_apply(totals, number) for number, totals in enumerate(steps, 1)]

    def test_every_rank_decides_alike_when_one_rank_is_non_finite(self):
        steps = [reduced((1.0, 0.5, False), (1.0, 0.5, False)),
                 reduced((NAN, NAN, False), (1.0, 0.5, False)),
                 reduced((1.0, 0.5, False), (1.0, INF, False))]
        per_rank = [self.decisions(NonFiniteGuard(3), steps) for _ in range(2)]
        self.assertEqual(per_rank, [[True, False, False]] * 2)

    def test_a_finite_step_resets_the_count(self):
        bad, good = reduced((NAN, 0.5, False)), reduced((1.0, 0.5, False))
        guard = NonFiniteGuard(3)
        self.assertEqual(self.decisions(guard, [bad, bad, good, bad, bad]),
                         [False, False, True, False, False])
        self.assertEqual(guard.bad_steps, [4, 5])
        self.assertFalse(guard.diverged)
        guard.should_apply(bad, 6)
        self.assertTrue(guard.diverged)
        self.assertEqual(guard.bad_steps, [4, 5, 6])

    def test_a_limit_of_one_stops_at_the_first_non_finite_step(self):
        guard = NonFiniteGuard(1)
        self.assertFalse(guard.should_apply(reduced((1.0, INF, False)), 1))
        self.assertTrue(guard.diverged)

    def test_a_loss_scaler_overflow_is_skipped_but_not_counted(self):
        guard = NonFiniteGuard(2, loss_scaled=True)
        overflow, nan_loss = reduced((1.0, INF, False)), reduced((NAN, NAN, False))
        self.assertEqual(self.decisions(guard, [overflow, overflow, overflow]), [False] * 3)
        self.assertFalse(guard.diverged)
        self.decisions(guard, [nan_loss, nan_loss])
        self.assertTrue(guard.diverged)


class ClipGradientsTest(unittest.TestCase):
    """grad_clip_method: 'norm' scales every gradient by max / total norm, 'value' clamps each
    element; both return the total norm before clipping (the guard checks it is finite)."""

    def parameters(self) -> list[torch.nn.Parameter]:
        first, second = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
        first.grad, second.grad = torch.tensor([3.0, -0.5]), torch.tensor([4.0])
        return [first, second]

    def test_norm_and_value_clipping(self):
        accelerator = Accelerator(cpu=True)
        total = math.sqrt(9 + 0.25 + 16)
        by_norm = self.parameters()
        norm = clip_gradients(accelerator, iter(by_norm), 1.0, "norm")
        self.assertAlmostEqual(norm.item(), total, places=5)
        self.assertTrue(torch.allclose(by_norm[0].grad, torch.tensor([3.0, -0.5]) / total,
                                       atol=1e-5))
        by_value = self.parameters()
        norm = clip_gradients(accelerator, iter(by_value), 1.0, "value")
        self.assertAlmostEqual(norm.item(), total, places=5)
        self.assertEqual(by_value[0].grad.tolist(), [1.0, -0.5])
        self.assertEqual(by_value[1].grad.tolist(), [1.0])
        unclipped = self.parameters()
        clip_gradients(accelerator, iter(unclipped), 0.0, "value")  # 0: no clipping
        self.assertEqual(unclipped[1].grad.tolist(), [4.0])


class DivergingRunTest(unittest.TestCase):
    """learning_rate 1e6 without clipping on the tiny model: NaN within a few steps. The run
    stops with exit status 3 and every checkpoint it wrote (weights, EMA, optimizer) is
    finite."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-diverge-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        config = write_config(root, root / "data", "diverge", max_train_steps=10,
                              learning_rate=1e6, checkpointing_steps=1, use_ema=True,
                              max_nonfinite_steps=2, max_grad_norm=0)  # norm, no clipping
        cls.result = run_training(config, cls.tmp, timeout=240)
        cls.out = root / "diverge-out"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_run_stops_as_diverged(self):
        self.assertEqual(self.result.returncode, 3, self.result.stderr[-3000:])
        self.assertIn("training diverged", self.result.stderr)
        self.assertIn("a lower learning_rate (now 1e+06)", self.result.stderr)
        self.assertIn("max_grad_norm 1.0 (now 0", self.result.stderr)
        self.assertIn("skipped on every rank", self.result.stderr)

    def test_the_report_says_diverged_and_marks_the_skipped_steps(self):
        report = read_report(self.out)
        self.assertEqual(report.status, "diverged")
        skipped = [r["step"] for r in read_events(self.out, "step") if r["skipped"]]
        self.assertEqual(len(skipped), 2)  # max_nonfinite_steps in a row, the last included
        self.assertEqual(report.nonfinite, skipped)
        self.assertNotIn(skipped[0], [step for step, _ in report.series["loss"]])

    def test_nothing_non_finite_was_saved(self):
        files = sorted(self.out.glob("checkpoint-*/*.safetensors"))
        self.assertTrue(any(f.name == "ema.safetensors" for f in files), files)
        for path in files:
            for name, tensor in load_file(str(path)).items():
                if tensor.is_floating_point():
                    self.assertTrue(torch.isfinite(tensor).all(), f"{path}: {name}")

    def test_nothing_was_exported_and_any_summary_is_json(self):
        self.assertFalse((self.out / "pipeline").exists())
        summary = self.out / "training_summary.json"
        if summary.exists():
            value = json.loads(summary.read_text())
            self.assertTrue(value["final_loss"] is None or math.isfinite(value["final_loss"]))


if __name__ == "__main__":
    unittest.main()
