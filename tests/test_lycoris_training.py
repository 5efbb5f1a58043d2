"""lora_type 'lycoris' through the real trainer, with the real lycoris-lora library: a LoKr and
a LoHa run train, resume exactly, and export a LyCORIS file that LyCORIS's own
create_lycoris_from_weights puts on the base network with the trained outputs; a LoKr does the same
on an int8 base: quanto's, and torchao's in LyCORIS's bypass_mode. The runs are in this process
(the launchers are tested once, in their own tests)."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors import safe_open

from trained_outputs import ResumedAdapterRun, tiny_sd1x_unet, unet_output
from training_fixtures import ResumedRunPair, run_in_process

LOKR = {"algo": "lokr", "multiplier": 1.0, "linear_dim": 10000, "linear_alpha": 1, "factor": 4,
        "apply_preset": {"target_module": ["Attention", "FeedForward"],
                         "module_algo_map": {"Attention": {"factor": 4},
                                             "FeedForward": {"factor": 2}}}}
LOHA = {"algo": "loha", "linear_dim": 4, "linear_alpha": 2,
        "apply_preset": {"target_module": ["Attention"]}}


class LycorisRunPair(ResumedAdapterRun, ResumedRunPair):
    """An 8-step run with ``lycoris`` as lycoris_config (two epochs) and a run resumed from its
    checkpoint-4, both in this process; subclasses set the algorithm."""

    per_size, resume_step = 4, 4
    launch = staticmethod(run_in_process)
    lycoris: dict
    more_options: dict = {}  # beside or instead of the run's options

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="st-lycoris-config-")
        path = Path(cls.config_dir) / "lycoris_config.json"
        path.write_text(json.dumps(cls.lycoris))
        cls.options = {**dict(model_type="lora", lora_type="lycoris", lycoris_config=str(path),
                              learning_rate=5e-3, max_train_steps=8, checkpointing_steps=4,
                              lr_scheduler="cosine"), **cls.more_options}
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.config_dir, ignore_errors=True)

    def test_the_resumed_run_resumed_at_its_checkpoint(self):
        self.assert_resumed_at(self.resumed_out, 4)

    def test_lycoris_loads_the_export_onto_the_base_with_the_trained_outputs(self):
        from lycoris import create_lycoris_from_weights

        from simpletuner.training.adapters.lora import load_adapter_weights
        from simpletuner.training.adapters.lycoris_adapter import add_lycoris

        export = self.full_out / "lora" / "pytorch_lora_weights.safetensors"
        with safe_open(str(export), "pt") as handle:
            metadata, keys = handle.metadata(), list(handle.keys())
        self.assertEqual(metadata["ss_network_module"], "lycoris.kohya")
        self.assertEqual(json.loads(metadata["lycoris_config"]), self.lycoris)
        self.assertTrue(all(k.startswith("lycoris_") for k in keys), keys[:3])
        base = unet_output(tiny_sd1x_unet(self.tmp))
        loaded_unet = tiny_sd1x_unet(self.tmp)
        network, _ = create_lycoris_from_weights(1.0, str(export), loaded_unet)
        network.apply_to()
        self.assertEqual(type(network.loras[0]).__name__, self.module_class)
        trained_unet = tiny_sd1x_unet(self.tmp)  # the trainer's adapter with the last checkpoint
        add_lycoris(trained_unet, self.lycoris, "sd1x")
        load_adapter_weights(trained_unet, self.full_out / "checkpoint-8" /
                             "lora_adapter.safetensors")
        loaded, trained = unet_output(loaded_unet), unet_output(trained_unet)
        self.assertGreater((trained - base).abs().max().item(), 1e-4, "training changed nothing")
        self.assertLessEqual((loaded - trained).abs().max().item(), 1e-5)


class LoKrRunTest(LycorisRunPair, unittest.TestCase):
    tmp_prefix, lycoris, module_class = "st-lokr-", LOKR, "LokrModule"


class LoHaRunTest(LycorisRunPair, unittest.TestCase):
    tmp_prefix, lycoris, module_class = "st-loha-", LOHA, "LohaModule"


class QuantizedBaseRun(LycorisRunPair):
    """A LoKr over a UNet quantized to ``precision``."""

    module_class, precision = "LokrModule", ""

    @classmethod
    def setUpClass(cls):
        cls.more_options = {"base_model_precision": cls.precision, "learning_rate": 1e-2}
        super().setUpClass()

    def test_the_export_on_the_unquantized_base_differs_only_by_the_quantization(self):
        """The trained network is the quantized base with the adapter; the export, put by
        LyCORIS on the float base as ComfyUI users run it, gives that output but for the
        quantization's rounding."""
        from lycoris import create_lycoris_from_weights

        from simpletuner.training.adapters.lora import load_adapter_weights
        from simpletuner.training.adapters.lycoris_adapter import add_lycoris
        from simpletuner.training.memory.quantization import PRECISIONS

        quantized = tiny_sd1x_unet(self.tmp)
        PRECISIONS[self.precision].quantize(quantized.requires_grad_(False), torch.float32)
        base = unet_output(quantized)
        rounding = (base - unet_output(tiny_sd1x_unet(self.tmp))).abs().max().item()
        add_lycoris(quantized, self.lycoris, "sd1x")
        load_adapter_weights(quantized,
                             self.full_out / "checkpoint-8" / "lora_adapter.safetensors")
        trained = unet_output(quantized)
        on_float = tiny_sd1x_unet(self.tmp)
        network, _ = create_lycoris_from_weights(
            1.0, str(self.full_out / "lora" / "pytorch_lora_weights.safetensors"), on_float)
        network.apply_to()
        self.assertGreater(rounding, 0.0, f"the {self.precision} base rounds nothing")
        self.assertGreater((trained - base).abs().max().item(), 2 * rounding)
        self.assertLessEqual((unet_output(on_float) - trained).abs().max().item(), 2 * rounding)


class BypassLoKrOnInt8TorchaoTest(QuantizedBaseRun, unittest.TestCase):
    """torchao's weights take no weight update: bypass mode adds the adapter's output instead."""

    tmp_prefix, precision = "st-lokr-torchao-", "int8-torchao"
    lycoris = dict(LOKR, bypass_mode=True)


class LoKrOnInt8QuantoTest(QuantizedBaseRun, unittest.TestCase):
    """LyCORIS bypasses quanto's layers itself (bypass_mode unset)."""

    tmp_prefix, precision, lycoris = "st-lokr-quanto-", "int8-quanto", LOKR


class LoKrOnNF4Test(QuantizedBaseRun, unittest.TestCase):
    """bitsandbytes' NF4 on the CPU; LyCORIS bypasses its LinearNF4 layers itself."""

    tmp_prefix, precision, lycoris = "st-lokr-nf4-", "nf4-bnb", LOKR


if __name__ == "__main__":
    unittest.main()
