"""Will it fit (training/memory/fitting.py): on figures worked out by hand, the device peak with
activations and block swap, and the first settings that fit a budget; the host bytes it plans
are the swapped block's real tensors after a step of tiny Flux; then `plan --memory
--gpu-memory 24` on a Flux-dev-sized folder (published configs, tiny-flux's tokenizers and
scheduler): the block count it proposes fits, one fewer does not."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

from launching import REPO
from memory_fixtures import case_config, module_bytes, tensor_bytes
from model_fixtures import TinyModelCase, random_batch
from simpletuner.cli import main
from simpletuner.configuration.options import TrainingConfig
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.activations import ActivationBytes
from simpletuner.training.memory.block_swap import place_network
from simpletuner.training.memory.fitting import (BlockCosts, Setting, changes, device_peak,
                                                 fitting_setting)
from simpletuner.training.memory.model import RankBytes, meta_network
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.settings import BlockSwapSettings, OptimizerSettings
from test_memory_plan_command import write_flux_dev_folder
from training_fixtures import make_shapes, write_config

GIB = 1 << 30

# A LoRA on a frozen base: ten blocks of 2 GiB and 2 GiB outside them; 10 GiB of VAE and text
# encoders kept on the device; 12 GiB of activations, 4 GiB under gradient checkpointing
# (12 - 10 inside the blocks + 1 of block inputs + 1 for the largest block).
HELD = RankBytes(network_while_caching={"bfloat16": 22 * GIB}, trainable={},
                 frozen={"bfloat16": 22 * GIB}, gradients=0, optimizer=0, ema=0,
                 frozen_components={"bfloat16": 10 * GIB}, components_stay=True)
ACTIVATIONS = ActivationBytes(saved=12 * GIB, blocks_saved=10 * GIB, blocks_inputs=GIB,
                              largest_block=GIB)
COSTS = BlockCosts(weights=(2 * GIB,) * 10, training=(0,) * 10)
TRAINING = TrainingConfig(model_family="flux", pretrained_model_name_or_path="unused",
                          output_dir="unused", data_backend_config="unused",
                          frozen_components_after_caching="keep")


class FittingTest(unittest.TestCase):
    def test_device_peak_with_four_blocks_swapped(self):
        peak = device_peak(HELD, ACTIVATIONS, COSTS, Setting("offload", True, 4))
        self.assertEqual(peak.while_caching, (22 - 8 + 10) * GIB)  # encoders there to cache
        self.assertEqual(peak.while_training, (22 - 8 + 4 + 4) * GIB)  # two blocks staged
        self.assertEqual((peak.on_host, peak.staged, peak.activations),
                         (8 * GIB, 4 * GIB, 4 * GIB))

    def test_as_configured_it_fits_a_large_card(self):
        setting, peak = fitting_setting(HELD, ACTIVATIONS, COSTS, TRAINING, 60 * GIB)
        self.assertEqual(setting, Setting("keep", False, 0))
        self.assertEqual(peak.peak, (22 + 12 + 10) * GIB)

    def test_24_gib_takes_offload_checkpointing_and_four_blocks(self):
        # Caching needs 32 - 2n <= 24 GiB: n = 4 (training: 30 - 2n with checkpointing).
        setting, peak = fitting_setting(HELD, ACTIVATIONS, COSTS, TRAINING, 24 * GIB)
        self.assertEqual(setting, Setting("offload", True, 4))
        self.assertEqual(peak.peak, 24 * GIB)
        self.assertEqual(changes(Setting.of(TRAINING), setting),
                         "frozen_components_after_caching 'offload', gradient_checkpointing "
                         "true, musubi_blocks_to_swap 4")

    def test_nothing_fits_when_caching_alone_is_too_large(self):
        self.assertIsNone(fitting_setting(HELD, ACTIVATIONS, COSTS, TRAINING, 11 * GIB))


class HostBytesOfATinyRunTest(TinyModelCase):
    def test_planned_host_bytes_are_the_swapped_blocks_tensors(self):
        """After an AdamW step of tiny Flux with its last block swapped: the block's parameters,
        gradients and optimizer state are the bytes the plan puts on the host (within 5 %)."""
        for model_type in ("full", "lora"):
            with self.subTest(model_type=model_type):
                training = case_config({"family": "flux", "model_type": model_type,
                                        "gradient_checkpointing": True,
                                        "musubi_blocks_to_swap": 1})
                adapter = self.load("flux")
                swap = place_network(adapter, BlockSwapSettings.from_config(training),
                                     torch.device("cpu"))
                if model_type == "lora":
                    add_adapter(adapter.trainable, type(adapter), training)
                adapter.set_gradient_checkpointing(True)
                optimizer = build_optimizer(adapter.trainable,
                                            OptimizerSettings.from_config(training))
                adapter.compute_loss(random_batch(adapter, 1),
                                     torch.Generator().manual_seed(0)).backward()
                optimizer.step()
                block = swap.host_blocks[0]
                parameters = list(block.parameters())
                trained = [p for p in parameters if p.requires_grad]
                real = (module_bytes([block]) + sum(tensor_bytes(p.grad) for p in trained)
                        + sum(tensor_bytes(t) for p in trained
                              for t in optimizer.state[p].values()
                              if isinstance(t, torch.Tensor)))
                network = meta_network(type(adapter), adapter.folder, training)
                costs = BlockCosts.of(type(adapter).swappable_blocks(network), training)
                planned = device_peak(HELD, ACTIVATIONS, costs, Setting.of(training)).on_host
                self.assertAlmostEqual(planned / real, 1, delta=0.05)


class FluxDevOn24GiBTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Path(cls.enterClassContext(tempfile.TemporaryDirectory(prefix="st-fit-")))
        folder = write_flux_dev_folder(cls.root)
        tiny = ensure_builtin_model("tiny-flux")
        for name in ("tokenizer", "tokenizer_2", "scheduler"):
            shutil.copytree(tiny / name, folder / name)
        make_shapes(cls.root / "data", per_size=1, sizes=((64, 64),))
        cls.folder = folder

    def plan(self, **options) -> tuple[int, str]:
        return self.plan_args([], **options)

    def plan_args(self, arguments: list[str], **options) -> tuple[int, str]:
        config = write_config(self.root, self.root / "data", model_family="flux",
                              pretrained_model_name_or_path=str(self.folder),
                              mixed_precision="bf16", model_type="lora", resolution=1024,
                              train_batch_size=1, **options)
        printed = io.StringIO()
        with redirect_stdout(printed):
            status = main(["plan", "--memory", "--config", str(config), "--gpu-memory", "24",
                           *arguments])
        return status, printed.getvalue()

    def test_a_bucket_size_can_be_planned(self):
        status, output = self.plan_args(["--size", "1536x640"])
        self.assertEqual(status, 1, output)
        self.assertIn("a micro-batch of 1 at 1536x640, gradient_checkpointing off", output)
        with self.assertRaises(SystemExit), redirect_stderr(io.StringIO()) as errors:
            self.plan_args(["--size", "12x"])
        self.assertIn("'12x' is not a size: use an integer side, 'WxH'", errors.getvalue())

    def test_a_device_memory_that_is_no_size_is_refused_before_anything_loads(self):
        for value in ("nan", "inf", "-5", "0"):
            with self.subTest(value=value), self.assertRaises(SystemExit) as stop, \
                    redirect_stderr(io.StringIO()) as errors:
                main(["plan", "--memory", "--config", "unused.json", "--gpu-memory", value])
            self.assertEqual(stop.exception.code, 2)
            self.assertIn(f"--gpu-memory: '{value}': a device's memory in GiB, above 0",
                          errors.getvalue())

    def test_the_proposed_block_count_fits_and_one_fewer_does_not(self):
        status, output = self.plan()
        self.assertEqual(status, 1, output)
        proposal = output.splitlines()[-1]
        self.assertIn("does not fit in 24 GiB", proposal)
        count = int(proposal.split("musubi_blocks_to_swap ")[1].split()[0])
        self.assertGreater(count, 0)
        fitted = dict(gradient_checkpointing=True, frozen_components_after_caching="offload")
        status, output = self.plan(musubi_blocks_to_swap=count, **fitted)
        self.assertEqual(status, 0, output)
        self.assertIn(f"{count} of 57 blocks swapped", output)
        self.assertIn("fits in 24 GiB", output.splitlines()[-1])
        status, output = self.plan(musubi_blocks_to_swap=count - 1, **fitted)
        self.assertEqual(status, 1, output)
        self.assertIn(f"musubi_blocks_to_swap {count} ", output.splitlines()[-1])


class PublishedConfigsTest(unittest.TestCase):
    def test_the_benchmarks_copy_matches_the_family_tests(self):
        """benchmarks/plan_24gb.py plans benchmarks/published_configs.json: the same values as
        the family tests check against the published parameter counts."""
        from test_family_qwen_image import QWEN_IMAGE_CONFIGS
        from test_family_wan import SHARED_CONFIGS, transformer_config
        from test_memory_plan_command import FLUX_DEV_CONFIGS
        copy = json.loads((REPO / "benchmarks" / "published_configs.json").read_text())
        self.assertEqual(copy["flux-dev"], FLUX_DEV_CONFIGS)
        self.assertEqual(copy["qwen-image"], QWEN_IMAGE_CONFIGS)
        self.assertEqual(copy["wan-14b"], {"transformer": transformer_config("14b"),
                                           **SHARED_CONFIGS})


if __name__ == "__main__":
    unittest.main()
