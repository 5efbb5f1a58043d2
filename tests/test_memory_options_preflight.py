"""Precisions and optimizers this machine, install or config cannot run are configuration errors
reported together by preflight, before any model loads or any cache is written."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.training.preflight import run_preflight

from training_fixtures import environment, make_shapes, run_training, write_config

LORA = dict(model_type="lora", lora_rank=4)


class MemoryOptionsPreflightTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-lean-preflight-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.enterClassContext(mock.patch.dict(os.environ, environment(cls.tmp)))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def problems(self, name: str, **options) -> str:
        """Preflight's message for a config with ``options`` ("" when it passes)."""
        config = write_config(self.root, self.root / "data", name, **options)
        try:
            run_preflight(load_configuration(config))
        except ConfigError as error:
            return str(error)
        return ""

    def test_a_good_lean_config_passes(self):
        self.assertEqual(self.problems("good", **LORA, model_family="flux",
                                       pretrained_model_name_or_path="builtin:tiny-flux",
                                       base_model_precision="int8-torchao",
                                       text_encoder_2_precision="int8-quanto",
                                       optimizer="adamw_bf16", mixed_precision="bf16"), "")

    def test_unknown_names_list_the_known_ones(self):
        message = self.problems("names", optimizer="adam8bit", base_model_precision="int9")
        for known in ("'adamw_bf16'", "'ao-adamw8bit'", "'prodigy'", "'int8-torchao'",
                      "'nf4-bnb'"):
            self.assertIn(known, message)

    @unittest.skipIf(torch.cuda.is_available(), "the refusals are for a machine without CUDA")
    def test_cuda_only_choices_are_refused_on_this_machine_all_at_once(self):
        message = self.problems("cuda", **LORA, base_model_precision="fp8-torchao",
                                text_encoder_1_precision="fp8-torchao",
                                optimizer="bnb-adamw8bit")
        for fragment in ("'base_model_precision' is 'fp8-torchao', which needs a CUDA device",
                         "'text_encoder_1_precision' is 'fp8-torchao', which needs a CUDA "
                         "device of compute capability 8.9",
                         "'optimizer' is 'bnb-adamw8bit', which needs a CUDA device"):
            self.assertIn(fragment, message)

    @unittest.skipIf(torch.cuda.is_available(), "the refusal is for a machine without CUDA")
    def test_nf4_is_refused_with_advice_where_bitsandbytes_cannot_quantize_on_the_cpu(self):
        self.assertEqual(self.problems("nf4", **LORA, base_model_precision="nf4-bnb"), "")
        # What torch raises for an operator without a CPU kernel, as in older bitsandbytes.
        missing = NotImplementedError("Could not run 'bitsandbytes::quantize_4bit' with "
                                      "arguments from the 'CPU' backend")
        with mock.patch("bitsandbytes.functional.quantize_4bit", side_effect=missing):
            message = self.problems("old-bnb", **LORA, base_model_precision="nf4-bnb")
        for fragment in ("'base_model_precision' is 'nf4-bnb', which needs a CUDA device, or "
                         "a bitsandbytes whose CPU backend runs NF4", "pip install -U "
                         "bitsandbytes", "use 'int8-torchao' or 'int8-quanto'"):
            self.assertIn(fragment, message)

    def test_a_quantized_network_is_not_fully_fine_tuned(self):
        self.assertIn("a quantized network cannot be fully fine-tuned",
                      self.problems("full", base_model_precision="int8-quanto"))

    def test_a_text_encoder_the_family_lacks(self):
        self.assertIn("sd1x has 1 text encoder(s)",
                      self.problems("encoders", text_encoder_2_precision="int8-torchao"))

    def test_bf16_weights_need_bf16_autocast(self):
        self.assertIn("set mixed_precision to 'bf16'",
                      self.problems("bf16", optimizer="adamw_bf16"))

    def test_optimizer_config_keys_are_checked_against_the_signature(self):
        message = self.problems("keys", optimizer="lion", optimizer_config="betas=[0.9,0.99],"
                                "kahan=true")
        self.assertIn("['kahan'] are not arguments of lion", message)
        self.assertIn("'betas'", message)  # what it accepts
        self.assertEqual(self.problems("keys-ok", optimizer="prodigy",
                                       optimizer_config="d_coef=2,safeguard_warmup=true"), "")

    def test_a_missing_extra_names_the_pip_install(self):
        find_spec = importlib.util.find_spec
        absent = {"optimi", "optimum.quanto"}
        with mock.patch("importlib.util.find_spec",
                        lambda name, *a: None if name in absent else find_spec(name, *a)):
            message = self.problems("extras", **LORA, base_model_precision="int8-quanto",
                                    optimizer="adamw_bf16", mixed_precision="bf16")
        self.assertIn("needs the optimi package: pip install 'simpletuner[optimizers]'", message)
        self.assertIn("needs the optimum.quanto package: pip install "
                      "'simpletuner[quantization]'", message)

    @unittest.skipIf(torch.cuda.is_available(), "the refusal is for a machine without CUDA")
    def test_the_trainer_stops_before_any_heavy_work(self):
        config = write_config(self.root, self.root / "data", "run", **LORA,
                              base_model_precision="fp8-torchao")
        result = run_training(config, self.tmp)
        self.assertEqual(result.returncode, 2)  # train.py's status for a configuration error
        self.assertIn("'fp8-torchao', which needs a CUDA device", result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertFalse((self.root / "run-out" / "cache").exists())


if __name__ == "__main__":
    unittest.main()
