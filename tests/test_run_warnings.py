"""Warnings for runs that work but not as probably meant: launcher process count, stuck EMA."""

from __future__ import annotations

import unittest
from types import SimpleNamespace

from simpletuner.training.run.run_warnings import ema_warning, process_count_warning, run_warnings


class RunWarningsTest(unittest.TestCase):
    def test_a_different_process_count_is_named(self):
        self.assertIsNone(process_count_warning(4, 4))
        warning = process_count_warning(4, 1)
        self.assertIn("num_processes 4, but the launcher started 1", warning)

    def test_ema_that_cannot_move_in_the_run(self):
        self.assertIsNone(ema_warning(0.99, 2000))       # 0.99**2000 is about 0
        warning = ema_warning(0.999, 100)                # keeps about 90 %
        self.assertIn("keep 90% of the starting weights", warning)
        self.assertIn("below 0.9931", warning)           # 0.5 ** (1 / 100)
        self.assertIsNotNone(ema_warning(1.0, 10_000))
        self.assertIsNone(ema_warning(0.999, 0))

    def test_run_warnings_checks_ema_only_when_used(self):
        training = SimpleNamespace(num_processes=1, use_ema=False, ema_decay=0.9999,
                                   lr_scheduler="cosine", lr_warmup_steps=50)
        self.assertEqual(run_warnings(training, 1, 10), [])
        training.use_ema = True
        self.assertEqual(len(run_warnings(training, 2, 10)), 2)

    def test_warm_up_without_effect_under_constant(self):
        training = SimpleNamespace(num_processes=1, use_ema=False, lr_scheduler="constant",
                                   lr_warmup_steps=50)
        (warning,) = run_warnings(training, 1, 10)
        self.assertIn("lr_warmup_steps 50 has no effect with lr_scheduler 'constant'", warning)
        self.assertIn("'constant_with_warmup'", warning)
        training.lr_warmup_steps = 0
        self.assertEqual(run_warnings(training, 1, 10), [])


if __name__ == "__main__":
    unittest.main()
