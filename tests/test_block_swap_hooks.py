"""Block swap's hooks on a three-block Wan transformer (two blocks swapped), on the CPU: each
swapped block computes with fresh device copies of its tensors, never the host tensors; the
next block is staged while one runs (forward: the one after, the recomputing backward: the one
before); gradients reach the host parameters equal to an unswapped network's; the network is
placed with the swapped blocks left behind; every transformer family trains to the same weights
with all its blocks swapped; and what cannot work is refused before training."""

from __future__ import annotations

import copy
import json
import tempfile
import unittest
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel

from model_fixtures import TinyModelCase, random_batch
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.configuration.families import FLOW_FAMILIES
from simpletuner.models.transfer import to_device_except
from simpletuner.training.memory.block_swap import (BlockSwap, BlockSwapError, place_network,
                                                    swapped_blocks)
from simpletuner.training.settings import BlockSwapSettings

CPU = torch.device("cpu")


def three_block_wan() -> WanTransformer3DModel:
    torch.manual_seed(0)
    network = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16,
        out_channels=16, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=3,
        rope_max_seq_len=32)
    network.enable_gradient_checkpointing()
    return network


def wan_inputs() -> dict:
    generator = torch.Generator().manual_seed(1)
    return {"hidden_states": torch.randn(2, 16, 1, 4, 4, generator=generator),
            "timestep": torch.tensor([100.0, 700.0]),
            "encoder_hidden_states": torch.randn(2, 6, 32, generator=generator),
            "return_dict": False}


class SwappedBlocksHooksTest(unittest.TestCase):
    def setUp(self):
        self.plain = three_block_wan()
        self.network = copy.deepcopy(self.plain)
        self.swap = BlockSwap(list(self.network.blocks[1:]), self.network.blocks[0], CPU)
        self.seen = []
        for index, block in enumerate(self.network.blocks[1:]):  # after the swap's own hooks
            block.register_forward_pre_hook(lambda module, _, i=index: self._observe(i, module))

    def _observe(self, index: int, block: torch.nn.Module) -> None:
        """Which block is staged meanwhile, and whether a weight in use is its host tensor
        (or shares its memory)."""
        slots, host_tensors = self.swap.originals[index]
        query = block.attn1.to_q
        host = next(t for (module, _, name), t in zip(slots, host_tensors)
                    if module is query and name == "weight")
        prefetched = self.swap.prefetched.index if self.swap.prefetched else None
        self.seen.append((index, prefetched, query.weight is host,
                          query.weight.data_ptr() == host.data_ptr()))

    def test_blocks_run_on_copies_with_the_next_one_staged(self):
        output = self.network(**wan_inputs())[0]
        output.square().mean().backward()
        # forward: block 0 stages 1; block 1 is the last. Backward recomputes 1 (stages 0), then 0.
        self.assertEqual([(i, p) for i, p, _, _ in self.seen], [(0, 1), (1, None), (1, 0),
                                                                 (0, None)])
        self.assertFalse(any(same or shared for _, _, same, shared in self.seen))
        self.assertEqual(self.swap.originals, {})  # every host tensor is back in its module
        self.assertIsInstance(self.network.blocks[2].attn1.to_q.weight, torch.nn.Parameter)

    def test_host_parameters_get_the_unswapped_gradients(self):
        self.plain(**wan_inputs())[0].square().mean().backward()
        self.network(**wan_inputs())[0].square().mean().backward()
        expected = dict(self.plain.named_parameters())
        for name, parameter in self.network.named_parameters():
            self.assertIsNotNone(parameter.grad, name)
            self.assertTrue(torch.equal(parameter.grad, expected[name].grad), name)

    def test_without_gradients_the_output_is_the_same(self):
        with torch.no_grad():
            self.assertTrue(torch.equal(self.network(**wan_inputs())[0],
                                        self.plain(**wan_inputs())[0]))
        self.assertTrue(all(p.grad is None for p in self.network.parameters()))

    def test_placing_the_network_leaves_the_host_blocks(self):
        to_device_except(self.network, torch.device("meta"), self.swap.host_blocks)
        devices = {name: p.device.type for name, p in self.network.named_parameters()}
        self.assertEqual({d for n, d in devices.items() if n.startswith(("blocks.1.",
                                                                          "blocks.2."))}, {"cpu"})
        self.assertEqual({d for n, d in devices.items() if not n.startswith(("blocks.1.",
                                                                              "blocks.2."))},
                         {"meta"})
        self.assertEqual(self.network.scale_shift_table.device.type, "meta")  # the root's own


class EveryTransformerFamilyTest(TinyModelCase):
    """Every block swapped: two AdamW steps end with the unswapped weights, in each family."""

    def trained(self, family: str, swapped: bool) -> dict[str, torch.Tensor]:
        adapter = self.load(family)
        count = len(adapter.swappable_blocks(adapter.trainable)) if swapped else 0
        place_network(adapter, BlockSwapSettings(count, "cpu"), CPU)
        adapter.set_gradient_checkpointing(True)
        batch = random_batch(adapter, 2)
        optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=1e-3)
        for step in range(2):
            adapter.compute_loss(batch, torch.Generator().manual_seed(step)).backward()
            optimizer.step()
            optimizer.zero_grad()
        return adapter.trainable.state_dict()

    def test_families(self):
        for family in FLOW_FAMILIES:
            with self.subTest(family=family):
                plain, swapped = self.trained(family, False), self.trained(family, True)
                self.assertTrue(any(not torch.equal(plain[k], v) for k, v in
                                    self.load(family).trainable.state_dict().items()))
                for key, tensor in plain.items():
                    self.assertTrue(torch.equal(tensor, swapped[key]), f"{family}: {key}")


class RefusedBlockSwapTest(unittest.TestCase):
    def test_more_blocks_than_the_network_has(self):
        class Adapter:
            trainable = three_block_wan()

            @staticmethod
            def swappable_blocks(network):
                return list(network.blocks)

        with self.assertRaisesRegex(BlockSwapError, "musubi_blocks_to_swap is 4, but "
                                    "WanTransformer3DModel has 3 blocks; set it to 3 or less"):
            swapped_blocks(Adapter(), 4)
        self.assertEqual(swapped_blocks(Adapter(), 3)[1], None)

    def test_every_problem_of_a_config_is_listed_at_once(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        (folder / "data").mkdir()
        (folder / "backend.json").write_text(json.dumps([
            {"id": "d", "instance_data_dir": str(folder / "data")}]))
        config = folder / "config.json"

        def problems(**options) -> str:
            config.write_text(json.dumps({
                "pretrained_model_name_or_path": "builtin:tiny-sdxl", "output_dir": str(
                    folder / "out"), "data_backend_config": str(folder / "backend.json"),
                "musubi_blocks_to_swap": 2, **options}))
            with self.assertRaises(ConfigError) as caught:
                load_configuration(str(config))
            return str(caught.exception)

        text = problems(model_family="sdxl", num_processes=2)
        self.assertIn("'musubi_blocks_to_swap' (2) swaps transformer blocks; model_family "
                      "'sdxl' is a UNet", text)
        self.assertIn("needs gradient_checkpointing true", text)
        self.assertIn("is for one process; with 2 processes use fsdp_enable", text)
        self.assertIn("and fsdp_enable both take weights off the device",
                      problems(model_family="flux", gradient_checkpointing=True,
                               fsdp_enable=True))
        self.assertNotIn("did you mean", text)


if __name__ == "__main__":
    unittest.main()
