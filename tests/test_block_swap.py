"""Block swap (musubi_blocks_to_swap) through the real trainer on the CPU: Flux and Wan, full
and LoRA (Flux's on an int8-quanto base too), end with the weights of the same run without
block swap and resume exactly; the trainer's log says how many blocks stay on the host."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load_file

from trained_outputs import LORA_WEIGHTS, TRANSFORMER_WEIGHTS
from training_fixtures import copy_checkpoint, make_shapes, run_in_process_logged, write_config


class SwappedRunTriple:
    """Mixed into a TestCase: the same 4-step run (checkpoints every 2) without block swap
    (``plain``), with it (``swapped``), and with it resumed from the swapped run's
    checkpoint-2 (``resumed``)."""

    family: str
    model_type: str
    blocks_to_swap: int
    total_blocks: int
    extra: dict = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix=f"st-swap-{cls.family}-{cls.model_type}-")
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=2)
        options = dict(model_family=cls.family, model_type=cls.model_type,
                       pretrained_model_name_or_path=f"builtin:tiny-{cls.family}",
                       lora_rank=4, gradient_checkpointing=True, max_train_steps=4,
                       checkpointing_steps=2, learning_rate=5e-3, **cls.extra)
        swapped = dict(options, musubi_blocks_to_swap=cls.blocks_to_swap)
        # In this process: what block swap does to a run, not how a run is launched.
        cls.runs = {"plain": run_in_process_logged(
                        write_config(root, root / "data", "plain", **options)),
                    "swapped": run_in_process_logged(
                        write_config(root, root / "data", "swapped", **swapped))}
        if copy_checkpoint(root, "swapped", "resumed", 2):
            cls.runs["resumed"] = run_in_process_logged(write_config(
                root, root / "data", "resumed", resume_from_checkpoint="latest", **swapped))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def weights(self, run: str, relative: str | None = None) -> dict[str, torch.Tensor]:
        if relative is None:
            relative = LORA_WEIGHTS if self.model_type == "lora" else TRANSFORMER_WEIGHTS
        return load_file(str(Path(self.tmp) / f"{run}-out" / relative))

    def test_runs_succeed_with_the_blocks_on_the_host(self):
        for name in ("plain", "swapped", "resumed"):
            self.assertIn(name, self.runs, "the swapped run left no checkpoint-2")
            self.assertEqual(self.runs[name].returncode, 0, self.runs[name].stderr[-3000:])
        self.assertIn(f"block swap: {self.blocks_to_swap} of {self.total_blocks} blocks live "
                      "on the cpu", self.runs["swapped"].stderr)
        self.assertNotIn("block swap:", self.runs["plain"].stderr)

    def test_swapped_run_ends_with_the_plain_runs_weights(self):
        plain, swapped = self.weights("plain"), self.weights("swapped")
        self.assertEqual(plain.keys(), swapped.keys())
        worst = max((plain[k] - swapped[k]).abs().max().item() for k in plain)
        self.assertLessEqual(worst, 1e-6)

    def test_training_moved_the_weights(self):
        name = "lora_adapter.safetensors" if self.model_type == "lora" else "model.safetensors"
        start = self.weights("swapped", f"checkpoint-2/{name}")
        end = self.weights("swapped", f"checkpoint-4/{name}")
        self.assertGreater(max((start[k] - end[k]).abs().max().item() for k in start), 0)

    def test_resumed_swapped_run_ends_with_the_same_weights(self):
        swapped, resumed = self.weights("swapped"), self.weights("resumed")
        self.assertEqual(swapped.keys(), resumed.keys())
        for key, tensor in swapped.items():
            self.assertTrue(torch.equal(tensor, resumed[key]), key)


class FluxFullBlockSwapTest(SwappedRunTriple, unittest.TestCase):
    family, model_type, blocks_to_swap, total_blocks = "flux", "full", 2, 2  # double + single


class FluxLoraBlockSwapTest(SwappedRunTriple, unittest.TestCase):
    family, model_type, blocks_to_swap, total_blocks = "flux", "lora", 1, 2


class FluxLoraOnAQuantizedBaseBlockSwapTest(SwappedRunTriple, unittest.TestCase):
    family, model_type, blocks_to_swap, total_blocks = "flux", "lora", 2, 2
    extra = {"base_model_precision": "int8-quanto"}


class WanFullBlockSwapTest(SwappedRunTriple, unittest.TestCase):
    family, model_type, blocks_to_swap, total_blocks = "wan", "full", 1, 1


class WanLoraBlockSwapTest(SwappedRunTriple, unittest.TestCase):
    family, model_type, blocks_to_swap, total_blocks = "wan", "lora", 1, 1


if __name__ == "__main__":
    unittest.main()
