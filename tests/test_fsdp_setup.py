"""The FSDP2 set-up's choices, in one process: which blocks are sharded as units (found from
the model's structure, for every family), names that match nothing, hybrid sharding on one
node, and the options' refusals."""

from __future__ import annotations

import os
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.training.memory.model import meta_network
from simpletuner.models.builtin import resolve_model_path
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.memory.sharding import ShardingError, device_mesh, named_blocks, repeated_blocks
from training_fixtures import make_shapes, write_config

FULL = type("Training", (), {"model_type": "full"})


def builtin_network(family: str) -> torch.nn.Module:
    adapter_class = get_adapter_class(family)
    return meta_network(adapter_class, resolve_model_path(f"builtin:tiny-{family}"), FULL)


class RepeatedBlocksTest(unittest.TestCase):
    def block_names(self, family: str) -> set[str]:
        return {type(block).__name__ for block in repeated_blocks(builtin_network(family))}

    def test_unet_families_shard_down_mid_and_up_blocks(self):
        for family in ("sd1x", "sd2x", "sdxl"):
            with self.subTest(family=family):
                names = self.block_names(family)
                self.assertTrue(any(name.endswith("DownBlock2D") for name in names), names)
                self.assertTrue(any(name.endswith("UpBlock2D") for name in names), names)
                self.assertTrue(any("MidBlock" in name for name in names), names)

    def test_transformer_families_shard_their_transformer_blocks(self):
        self.assertEqual(self.block_names("sd3"), {"JointTransformerBlock"})
        self.assertEqual(self.block_names("flux"),
                         {"FluxTransformerBlock", "FluxSingleTransformerBlock"})
        # Chroma's approximator (0.28 B of 8.9 B) is a unit of its own, gathered once a step.
        self.assertEqual(self.block_names("chroma"), {"ChromaTransformerBlock",
                                                      "ChromaSingleTransformerBlock",
                                                      "ChromaApproximator"})

    def test_every_block_is_outside_the_others(self):
        network = builtin_network("sdxl")
        blocks = repeated_blocks(network)
        inner = {id(m) for block in blocks for m in block.modules() if m is not block}
        self.assertFalse(any(id(block) in inner for block in blocks))

    def test_a_named_class_the_network_lacks_is_an_error_listing_its_blocks(self):
        with self.assertRaisesRegex(ShardingError, "FluxTransformerBlock"):
            named_blocks(builtin_network("flux"), ["BasicTransformerBlock"])

    def test_named_classes_come_innermost_first(self):
        network = builtin_network("sd1x")
        blocks = named_blocks(network, ["CrossAttnDownBlock2D", "BasicTransformerBlock"])
        first_outer = next(i for i, b in enumerate(blocks)
                           if type(b).__name__ == "CrossAttnDownBlock2D")
        inner_of_first_outer = {id(m) for m in blocks[first_outer].modules()}
        self.assertFalse(any(id(b) in inner_of_first_outer for b in blocks[first_outer + 1:]))


class HybridShardingTest(unittest.TestCase):
    def test_hybrid_on_one_node_is_refused(self):
        store = dist.HashStore()
        dist.init_process_group("gloo", rank=0, world_size=1, store=store)
        self.addCleanup(dist.destroy_process_group)
        with mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": "1"}):
            with self.assertRaisesRegex(ShardingError, "one node"):
                device_mesh("hybrid", "cpu")
        self.assertEqual(device_mesh("full", "cpu").size(), 1)


class FsdpOptionsTest(unittest.TestCase):
    def load(self, **options):
        with tempfile.TemporaryDirectory() as tmp:
            make_shapes(Path(tmp) / "data", per_size=1, sizes=((64, 64),))
            return load_configuration(str(write_config(Path(tmp), Path(tmp) / "data",
                                                       **options)))

    def test_fsdp1_is_refused_with_the_fix(self):
        with self.assertRaisesRegex(ConfigError, "fsdp_version 1 is not supported; use "
                                                 "fsdp_version 2"):
            self.load(fsdp_enable=True, fsdp_version=1)

    def test_fp16_is_refused_under_fsdp(self):
        with self.assertRaisesRegex(ConfigError, "bf16"):
            self.load(fsdp_enable=True, mixed_precision="fp16")

    def test_defaults_are_simpletuners(self):
        training = self.load(fsdp_enable=True).training
        self.assertEqual((training.fsdp_version, training.fsdp_state_dict_type,
                          training.fsdp_reshard_after_forward, training.fsdp_sharding),
                         (2, "SHARDED_STATE_DICT", True, "full"))


if __name__ == "__main__":
    unittest.main()
