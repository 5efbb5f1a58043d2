"""LyCORIS under FSDP2: two gloo processes through ./train.sh against two DDP processes, a LoKr
on sd1x; the LyCORIS parameters sit at the sharded root, the export is built on the gathered
copy, and DDP and FSDP2 end with the same adapter."""

from __future__ import annotations

import json
import shutil
import tempfile
import unittest
from pathlib import Path

from test_fsdp_training import LORA_WEIGHTS, DdpFsdpPair

LOKR = {"algo": "lokr", "linear_dim": 10000, "linear_alpha": 1, "factor": 4,
        "apply_preset": {"target_module": ["Attention"]}}


class LokrFsdpTest(DdpFsdpPair, unittest.TestCase):
    weights = LORA_WEIGHTS

    @classmethod
    def setUpClass(cls):
        cls.config_dir = tempfile.mkdtemp(prefix="st-lycoris-fsdp-")
        path = Path(cls.config_dir) / "lycoris_config.json"
        path.write_text(json.dumps(LOKR))
        cls.options = {"model_type": "lora", "lora_type": "lycoris", "lycoris_config": str(path),
                       "learning_rate": 5e-3, "validation_prompt": "a red circle",
                       "validation_num_inference_steps": 1, "validation_steps": 4}
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.config_dir, ignore_errors=True)

    def test_the_export_is_the_lycoris_file(self):
        from safetensors import safe_open

        with safe_open(str(self.out("fsdp") / LORA_WEIGHTS), "pt") as handle:
            self.assertEqual(handle.metadata()["ss_network_module"], "lycoris.kohya")
            self.assertTrue(all(k.startswith("lycoris_") for k in handle.keys()))


if __name__ == "__main__":
    unittest.main()
