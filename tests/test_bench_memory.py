"""benchmarks/bench_memory.py sizes each choice with the memory model plan --memory uses; its
rows for the tiny Flux network equal the bytes of the tensors the trainer creates for the same
choice (memory_fixtures.measure: real quantization, LoRA, backward pass and optimizer step),
and each row is set beside its mode's adamw/no_change row."""

from __future__ import annotations

import importlib.util
import sys
import unittest

from simpletuner.models.registry import get_adapter_class

from memory_fixtures import measure
from training_fixtures import REPO


def _load_benchmark():
    """benchmarks/ is a folder of scripts, not a package: load the file itself, with its folder
    importable as when it runs as a script (its helpers are in benchlib.py)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_memory",
                                                  REPO / "benchmarks" / "bench_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_memory = _load_benchmark()
PARTS = {"frozen": "frozen", "trainable": "trainable", "gradients": "gradients",
         "optimizer_state": "optimizer"}  # the benchmark's name: memory_fixtures' name


class BenchmarkRowsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        build, parts = bench_memory.tiny_models(("flux",))["tiny-flux"]
        cls.result = bench_memory.model_rows("tiny-flux", build, parts,
                                             get_adapter_class("flux"), rank=4)

    def row(self, mode: str, precision: str, optimizer: str) -> dict:
        return next(r for r in self.result["rows"] if (r["mode"], r["precision"],
                                                       r["optimizer"]) == (mode, precision,
                                                                           optimizer))

    def test_rows_equal_the_tensors_of_a_real_step(self):
        for mode, precision, optimizer in (("full", "no_change", "ao-adamw8bit"),
                                           ("lora", "int8-torchao", "adamw_bf16"),
                                           ("lora", "int8-quanto", "adamw")):
            with self.subTest(mode=mode, precision=precision, optimizer=optimizer):
                measured = measure({"family": "flux", "model_type": mode,
                                    "base_model_precision": precision, "optimizer": optimizer,
                                    "mixed_precision": "bf16",
                                    "frozen_components_after_caching": "free"})
                row = self.row(mode, precision, optimizer)
                self.assertEqual({name: row[name] for name in PARTS},
                                 {name: measured[part] for name, part in PARTS.items()})
                self.assertEqual(row["total"], measured["while_training"])

    def test_each_row_is_set_beside_its_modes_adamw_row(self):
        lines = bench_memory.render({"models": [self.result]}).splitlines()
        self.assertIn("x adamw/no_change", lines[2])
        ratios = {tuple(line.split()[:3]): float(line.split()[-1]) for line in lines[3:]}
        self.assertEqual(ratios[("full", "no_change", "adamw")], 1.0)
        baseline = self.row("full", "no_change", "adamw")["total"]
        bf16 = self.row("full", "no_change", "adamw_bf16")["total"]
        self.assertAlmostEqual(ratios[("full", "no_change", "adamw_bf16")],
                               bf16 / baseline, delta=0.005)
        self.assertLess(bf16, baseline)


if __name__ == "__main__":
    unittest.main()
