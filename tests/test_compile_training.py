"""dynamo_backend 'inductor' (regional compilation) in a real run: a tiny Flux LoRA trained
with its blocks compiled, and with gradient checkpointing, follows the eager run's losses; its
twin resumed from checkpoint-2 under compile ends with bit-equal adapter weights; the steps that
compiled say so in events.jsonl. One class, three in-process runs: compiling is slow on CPU.

Inductor builds its C++ kernels cold in CI (minutes on two cores: 377 s measured), so the suite
compiles the blocks with the aot_eager backend — dynamo's tracing and AOT autograd as inductor
gets them, everything of the run around them the same — and SIMPLETUNER_TEST_INDUCTOR=1 runs
the class with inductor itself (`SIMPLETUNER_TEST_INDUCTOR=1 python -m pytest -n 0
tests/test_compile_training.py`)."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch
from accelerate import Accelerator

from conformance import network_weights
from simpletuner.configuration import load_configuration
from simpletuner.training.recipe import Trainer
from simpletuner.training.reporting.report_page import throughput
from training_fixtures import make_shapes, read_events, write_config

OPTIONS = dict(model_family="flux", pretrained_model_name_or_path="builtin:tiny-flux",
               model_type="lora", lora_rank=4, learning_rate=1e-2, max_train_steps=4,
               checkpointing_steps=2)


INDUCTOR = os.environ.get("SIMPLETUNER_TEST_INDUCTOR") == "1"
_module_compile = torch.nn.Module.compile


def _compile_with_aot_eager(module, *args, **kwargs):
    return _module_compile(module, *args, **{**kwargs, "backend": "aot_eager"})


class CompiledTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not INDUCTOR:
            cls.enterClassContext(mock.patch.object(torch.nn.Module, "compile",
                                                    _compile_with_aot_eager))
        cls.root = Path(tempfile.mkdtemp(prefix="st-compile-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.accelerator = Accelerator(cpu=True)
        cls.data = cls.root / "data"
        make_shapes(cls.data, per_size=4, sizes=((64, 64),))
        cls.eager = cls.train_run("eager")
        compiled = dict(dynamo_backend="inductor", gradient_checkpointing=True)
        cls.compiled = cls.train_run("compiled", **compiled)
        cls.compiled_blocks = cls.compiled_block_count
        shutil.rmtree(cls.root / "compiled-out" / "checkpoint-4")
        cls.resumed = cls.train_run("compiled", resume_from_checkpoint="latest", **compiled)

    @classmethod
    def train_run(cls, name: str, **options) -> dict[str, torch.Tensor]:
        """The adapter's weights after training run ``name``."""
        config = write_config(cls.root, cls.data, name, **OPTIONS, **options)
        trainer = Trainer(load_configuration(config), cls.accelerator)
        trainer.set_up()
        trainer.train()
        network = trainer.parts.network
        cls.compiled_block_count = sum(
            getattr(block, "_compiled_call_impl", None) is not None
            for block in (*network.transformer_blocks, *network.single_transformer_blocks))
        weights = network_weights(trainer)
        del trainer
        gc.collect()
        return weights

    def test_compiled_run_trains_like_eager_and_resumes_bit_exactly(self):
        self.assertEqual(self.compiled_blocks, 2)  # the double- and the single-stream block
        eager = read_events(self.root / "eager-out", "step")
        compiled = read_events(self.root / "compiled-out", "step")
        self.assertEqual([e["step"] for e in compiled], [1, 2, 3, 4])
        for ours, theirs in zip(compiled, eager):
            self.assertAlmostEqual(ours["loss"], theirs["loss"], delta=1e-3 * theirs["loss"])
        self.assertGreater(compiled[0].get("compiling", 0), 0)  # the first step compiled
        self.assertFalse([e for e in eager if "compiling" in e])
        for name, tensor in self.eager.items():
            torch.testing.assert_close(self.compiled[name], tensor, rtol=1e-3, atol=1e-4)
        self.assertEqual(set(self.resumed), set(self.compiled))
        for name, tensor in self.compiled.items():
            self.assertTrue(torch.equal(tensor, self.resumed[name]), name)


class CompiledThroughputTest(unittest.TestCase):
    def test_the_report_counts_throughput_after_the_steps_that_compiled(self):
        steps = [{"step": 1, "time": 100.0, "compiling": 90.0},
                 {"step": 2, "time": 150.0, "compiling": 45.0},
                 {"step": 3, "time": 151.0}, {"step": 4, "time": 152.0}]
        self.assertEqual(throughput({"effective_batch": 2}, steps),
                         "1 steps/s, 2 samples/s (after 135 s compiling)")
        self.assertEqual(throughput({}, steps[:2]), "not measured yet (after 135 s compiling)")
        self.assertEqual(throughput({}, [{"step": 1, "time": 1.0}, {"step": 2, "time": 3.0}]),
                         "0.5 steps/s")


if __name__ == "__main__":
    unittest.main()
