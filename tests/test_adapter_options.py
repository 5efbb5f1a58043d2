"""lora_type, lycoris_config and lora_format: each mistake refused before any model loads,
naming the key (and the lycoris_config file and its key), every problem at once."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from training_fixtures import environment, make_shapes, write_config

LYCORIS = dict(model_type="lora", lora_type="lycoris")


class AdapterOptionsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-adapter-options-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.enterClassContext(mock.patch.dict(os.environ, environment(cls.tmp)))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def lycoris_file(self, name: str, content) -> str:
        path = self.root / f"lycoris-{name}.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return str(path)

    def problems(self, name: str, **options) -> str:
        from simpletuner.configuration import ConfigError, load_configuration
        from simpletuner.training.preflight import run_preflight

        config = write_config(self.root, self.root / "data", name, **options)
        with self.assertRaises(ConfigError) as caught:
            run_preflight(load_configuration(config))
        return str(caught.exception)

    def passes(self, name: str, **options) -> bool:
        from simpletuner.configuration import ConfigError, load_configuration
        from simpletuner.training.preflight import run_preflight

        try:
            run_preflight(load_configuration(write_config(self.root, self.root / "data", name,
                                                          **options)))
        except ConfigError:
            return False
        return True

    def test_lycoris_needs_a_lora_run_and_its_config_file(self):
        message = self.problems("full", model_type="full", lora_type="lycoris")
        self.assertIn("model_type is 'full'; set model_type to 'lora'", message)
        self.assertIn("lycoris_config is not set", message)  # both, in one report
        message = self.problems("missing", **LYCORIS,
                                lycoris_config=str(self.root / "absent.json"))
        self.assertIn("absent.json cannot be read", message)

    def test_each_bad_lycoris_config_value_is_named_with_the_file(self):
        path = self.lycoris_file("bad", {"algo": "lokx", "linear_dim": "big", "facotr": 16,
                                         "apply_preset": {"target_modules": ["Attention"]}})
        message = self.problems("bad", **LYCORIS, lycoris_config=path)
        for fragment in (path, "'algo' is 'lokx'", "lokr", "'linear_dim' is 'big'",
                         "['target_modules']", "target_module", "keys ['facotr'] are not"):
            self.assertIn(fragment, message)
        message = self.problems("notjson", **LYCORIS,
                                lycoris_config=self.lycoris_file("notjson", "{algo: lokr"))
        self.assertIn("is not JSON", message)

    def test_lycoris_numbers_out_of_range_are_records_at_their_key_in_its_file(self):
        from simpletuner.configuration import ConfigError, load_configuration
        from simpletuner.training.preflight import run_preflight

        path = self.lycoris_file("ranges", {"algo": "loha", "linear_dim": 0, "dropout": 2.0,
                                            "rank_dropout": -0.1, "module_dropout": 1,
                                            "conv_dim": 2.5})
        config = write_config(self.root, self.root / "data", "ranges", **LYCORIS,
                              lycoris_config=path)
        with self.assertRaises(ConfigError) as caught:
            run_preflight(load_configuration(config))
        found = {record.path: record.message for record in caught.exception.records
                 if record.file == path}
        self.assertEqual(sorted(found), ["conv_dim", "dropout", "linear_dim", "module_dropout",
                                         "rank_dropout"])
        self.assertIn("'dropout' is 2.0; a dropout rate must be at least 0 and below 1",
                      found["dropout"])
        self.assertIn("'linear_dim' is 0; LyCORIS takes a whole number of at least 1",
                      found["linear_dim"])
        self.assertTrue(self.passes("in-range", **LYCORIS, lycoris_config=self.lycoris_file(
            "in-range", {"algo": "loha", "linear_dim": 1, "dropout": 0.5, "conv_dim": 0})))

    def test_an_adapter_larger_than_the_hosts_ram_is_refused_before_the_model_loads(self):
        import re

        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        path = self.lycoris_file("huge", {"algo": "loha", "linear_dim": 100_000_000})
        message = self.problems("huge", **LYCORIS, lycoris_config=path)
        found = re.search(r"key 'lycoris_config': the lycoris adapter has ([\d,]+) parameters, "
                          r"([\d.]+) GiB in float32 as it is built on the host \(before its "
                          r"gradients and optimizer state\), more than this machine's "
                          r"([\d.]+) GiB of RAM; lower linear_dim in lycoris_config", message)
        self.assertIsNotNone(found, message)
        parameters = int(found.group(1).replace(",", ""))
        # a LoHa holds four rank-wide factors per adapted layer: billions at rank 1e8
        self.assertGreater(parameters * 4, ram)
        self.assertEqual(found.group(2), f"{parameters * 4 / 2**30:.1f}")
        self.assertEqual(found.group(3), f"{ram / 2**30:.1f}")
        self.assertTrue(self.passes("small", **LYCORIS, lycoris_config=self.lycoris_file(
            "small", {"algo": "loha", "linear_dim": 4})))

    def test_lycoris_on_a_torchao_base_without_bypass_mode_is_refused(self):
        path = self.lycoris_file("good", {"algo": "lokr", "factor": 4})
        message = self.problems("torchao", **LYCORIS, lycoris_config=path,
                                base_model_precision="int8-torchao")
        self.assertIn("needs \"bypass_mode\": true in lycoris_config", message)
        bypass = self.lycoris_file("bypass", {"algo": "lokr", "factor": 4, "bypass_mode": True})
        self.assertTrue(self.passes("bypass", **LYCORIS, lycoris_config=bypass,
                                    base_model_precision="int8-torchao"))
        for precision in ("int8-quanto", "nf4-bnb"):  # LyCORIS bypasses their layers itself
            with self.subTest(precision=precision):
                self.assertTrue(self.passes(precision, **LYCORIS, lycoris_config=path,
                                            base_model_precision=precision))

    def test_a_lycoris_config_without_lora_type_lycoris_is_refused(self):
        path = self.lycoris_file("unused", {"algo": "lokr"})
        message = self.problems("unused", model_type="lora", lycoris_config=path)
        self.assertIn("lora_type is 'standard'; set lora_type to 'lycoris'", message)

    def test_a_lora_format_other_than_diffusers_or_comfyui_is_refused(self):
        message = self.problems("kohya", model_type="lora", lora_format="kohya")
        self.assertIn("lora_format", message)
        self.assertIn("'comfyui'", message)

    def test_lora_format_comfyui_with_lycoris_is_refused_at_lora_format(self):
        path = self.lycoris_file("comfy", {"algo": "lokr", "factor": 4})
        message = self.problems("comfy-lycoris", **LYCORIS, lycoris_config=path,
                                lora_format="comfyui")
        self.assertIn("key 'lora_format' is 'comfyui', but lora_type 'lycoris' exports "
                      "LyCORIS's own file", message)
        self.assertTrue(self.passes("diffusers-lycoris", **LYCORIS, lycoris_config=path))

    def test_init_lora_needs_a_lora_run_and_a_file(self):
        message = self.problems("init-full", init_lora=str(self.root / "absent.safetensors"))
        self.assertIn("key 'init_lora' is set but model_type is 'full'", message)
        message = self.problems("init-absent", model_type="lora",
                                init_lora=str(self.root / "absent.safetensors"))
        self.assertIn("absent.safetensors is not a file", message)

    def test_simpletuner_lycoris_keys_that_ask_for_something_are_refused(self):
        message = self.problems("strength", model_type="lora", validation_lycoris_strength=0.5,
                                init_lokr_norm=0.001)
        self.assertIn("validation_lycoris_strength", message)
        self.assertIn("init_lokr_norm", message)


if __name__ == "__main__":
    unittest.main()
