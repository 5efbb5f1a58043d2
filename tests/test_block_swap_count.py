"""musubi_blocks_to_swap against the model's blocks, refused by ``check`` before anything loads:
the count each family's spec reads from its transformer's config.json is the one its adapter's
swappable_blocks gives on the loaded network."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from launching import run_bounded
from training_fixtures import environment, make_shapes, write_config

# family -> its tiny model and the blocks that network has, counted by hand from its recipe
# (tiny.py): SD3's two joint blocks, Flux's one double and one single block, Wan's one block.
TINY_BLOCKS = {"sd3": ("tiny-sd3", 2), "flux": ("tiny-flux", 2), "wan": ("tiny-wan", 1)}


class BlockSwapCountTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-block-count-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.enterClassContext(mock.patch.dict(os.environ, environment(cls.tmp)))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_specs_count_is_the_adapters_on_the_loaded_network(self):
        from simpletuner.models.block_count import TRAINED_SUBFOLDER, swappable_block_count
        from simpletuner.models.builtin import ensure_builtin_model
        from simpletuner.models.registry import get_adapter_class

        for family, (tiny, blocks) in TINY_BLOCKS.items():
            with self.subTest(family=family):
                folder = ensure_builtin_model(tiny)
                adapter_class = get_adapter_class(family)
                network = adapter_class.transformer_class.from_pretrained(
                    folder, subfolder=TRAINED_SUBFOLDER)
                self.assertEqual(len(adapter_class.swappable_blocks(network)), blocks)
                self.assertEqual(swappable_block_count(family, f"builtin:{tiny}"), blocks)
                self.assertEqual(swappable_block_count(family, str(folder)), blocks)

    def check(self, family: str, count: int) -> list[dict]:
        tiny, _ = TINY_BLOCKS[family]
        config = write_config(self.root, self.root / "data", f"{family}-{count}",
                              model_family=family, pretrained_model_name_or_path=f"builtin:{tiny}",
                              musubi_blocks_to_swap=count, gradient_checkpointing=True)
        result = run_bounded([sys.executable, "-m", "simpletuner", "check", "--config",
                              str(config), "--json"], tmpdir=self.root / "tmp", timeout=120)
        return [record for record in json.loads(result.stdout or "[]")
                if record["key"] == "musubi_blocks_to_swap"]

    def test_check_refuses_one_block_more_than_the_model_has(self):
        from simpletuner.models.builtin import ensure_builtin_model

        ensure_builtin_model("tiny-flux")
        records = self.check("flux", 3)
        self.assertEqual([r["message"] for r in records], [
            "key 'musubi_blocks_to_swap' is 3, but the model's transformer has 2 blocks to swap"])
        self.assertEqual(records[0]["fix"], "set it to 2 or less")
        self.assertEqual(self.check("flux", 2), [])


if __name__ == "__main__":
    unittest.main()
