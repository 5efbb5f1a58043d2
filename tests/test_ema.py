"""The EMA's update schedule (ema_update_interval, ema_warmup_steps), as SimpleTuner's."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import torch

from simpletuner.training.ema import EMAWeights, decay_at


class DecayScheduleTest(unittest.TestCase):
    def test_every_step_at_ema_decay_without_interval_or_warmup(self):
        self.assertEqual([decay_at(step, 0.9) for step in (1, 2, 7)], [0.9, 0.9, 0.9])

    def test_interval_updates_only_at_its_multiples(self):
        updated = [step for step in range(1, 13) if decay_at(step, 0.9, update_interval=4)]
        self.assertEqual(updated, [4, 8, 12])

    def test_warmup_copies_before_its_step_then_decays(self):
        self.assertEqual([decay_at(step, 0.9, warmup_steps=3) for step in (1, 2, 3, 4)],
                         [0.0, 0.0, 0.9, 0.9])

    def test_interval_and_warmup_together(self):
        schedule = {step: decay_at(step, 0.5, update_interval=2, warmup_steps=5)
                    for step in range(1, 9)}
        self.assertEqual(schedule, {1: None, 2: 0.0, 3: None, 4: 0.0, 5: None, 6: 0.5,
                                    7: None, 8: 0.5})


class EMAWeightsTest(unittest.TestCase):
    def test_shadow_follows_the_schedule(self):
        """Weights 1, 2, ... 6 after steps 1..6; interval 2, warm-up 3, decay 0.5: step 2
        copies (2), step 4 gives 0.5*2 + 0.5*4 = 3, step 6 gives 0.5*3 + 0.5*6 = 4.5."""
        module = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(module.weight)
        ema = EMAWeights(module, 0.5, update_interval=2, warmup_steps=3)
        seen = []
        for step in range(1, 7):
            with torch.no_grad():
                module.weight.fill_(float(step))
            ema.update(module, step)
            seen.append(ema.shadow["weight"].item())
        self.assertEqual(seen, [0.0, 2.0, 2.0, 3.0, 3.0, 4.5])

    def test_saved_and_loaded_midway_continues_as_uninterrupted(self):
        def run(steps, ema, module):
            for step in steps:
                with torch.no_grad():
                    module.weight.mul_(1.5).add_(step)
                ema.update(module, step)

        torch.manual_seed(0)
        module = torch.nn.Linear(3, 2)
        start = {k: v.clone() for k, v in module.state_dict().items()}
        whole = EMAWeights(module, 0.7, update_interval=3, warmup_steps=4)
        run(range(1, 11), whole, module)

        module.load_state_dict(start)
        first = EMAWeights(module, 0.7, update_interval=3, warmup_steps=4)
        run(range(1, 6), first, module)
        with tempfile.TemporaryDirectory() as folder:
            first.save(Path(folder) / "ema.safetensors")
            second = EMAWeights(module, 0.7, update_interval=3, warmup_steps=4)
            second.load(Path(folder) / "ema.safetensors")
        run(range(6, 11), second, module)
        for name, value in whole.shadow.items():
            self.assertTrue(torch.equal(value, second.shadow[name]), name)
        self.assertFalse(torch.equal(whole.shadow["weight"], module.weight.float()))


if __name__ == "__main__":
    unittest.main()
