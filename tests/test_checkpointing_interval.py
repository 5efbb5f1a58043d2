"""gradient_checkpointing_interval: every n-th block of each block list checkpointed, through
diffusers' checkpointing function (Flux) and Chroma's own per-block wrapping: the loss and the
gradients equal those of checkpointing every block, and the backward recomputes fewer blocks
(each block's attention calls counted); what cannot work is refused by config.json's checks,
dynamo_backend's combinations included."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import TinyModelCase, random_batch
from simpletuner.configuration import load_configuration
from training_fixtures import config_problems


def deepen(adapter, layers: int = 3) -> None:
    """The adapter's transformer rebuilt with ``layers`` double- and single-stream blocks."""
    network = adapter.transformer
    torch.manual_seed(0)
    adapter.transformer = type(network).from_config(
        {**network.config, "num_layers": layers, "num_single_layers": layers})


class CheckpointingIntervalTest(TinyModelCase):
    def run_interval(self, adapter, batch, interval: int):
        """(loss, gradients, forward calls per block list) of one step at ``interval``."""
        network = adapter.transformer
        adapter.set_gradient_checkpointing(True, interval)
        calls = {"double": [0] * len(network.transformer_blocks),
                 "single": [0] * len(network.single_transformer_blocks)}
        # on the block's attention: Chroma's recomputation calls the block's forward directly
        hooks = [block.attn.register_forward_pre_hook(lambda *_, c=counts, i=index: c.__setitem__(
                     i, c[i] + 1))
                 for name, counts in calls.items()
                 for index, block in enumerate(network.transformer_blocks if name == "double"
                                               else network.single_transformer_blocks)]
        network.zero_grad()
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(3))
        loss.backward()
        for hook in hooks:
            hook.remove()
        return loss.item(), [p.grad.clone() for p in network.parameters()], calls

    def assert_interval_two_recomputes_less(self, family: str) -> None:
        adapter = self.load(family)
        deepen(adapter)
        batch = random_batch(adapter, 2)
        every_loss, every, every_calls = self.run_interval(adapter, batch, 1)
        loss, gradients, calls = self.run_interval(adapter, batch, 2)
        self.assertEqual(loss, every_loss)
        for first, second in zip(every, gradients):
            torch.testing.assert_close(second, first, rtol=1e-5, atol=1e-7)
        # every block recomputed once at interval 1; at 2, blocks 0 and 2 of each list only
        self.assertEqual(every_calls, {"double": [2, 2, 2], "single": [2, 2, 2]})
        self.assertEqual(calls, {"double": [2, 1, 2], "single": [2, 1, 2]})

    def test_flux_through_diffusers_checkpointing(self):
        self.assert_interval_two_recomputes_less("flux")

    def test_chroma_through_its_own_block_wrapping(self):
        self.assert_interval_two_recomputes_less("chroma")

    def test_what_cannot_work_is_refused(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))

        def problems(**options) -> str:
            return config_problems(folder, **{
                "pretrained_model_name_or_path": "builtin:tiny-flux",
                "gradient_checkpointing_interval": 2, **options})

        self.assertIn("'sdxl' is a UNet: set it to 1",
                      problems(model_family="sdxl", gradient_checkpointing=True))
        # Without gradient_checkpointing the interval asks for nothing (SimpleTuner's
        # examples set it so): accepted.
        with self.assertRaisesRegex(AssertionError, "loaded without a problem"):
            problems(model_family="flux")
        self.assertIn("block swap needs every swapped block checkpointed",
                      problems(model_family="flux", gradient_checkpointing=True,
                               musubi_blocks_to_swap=1))
        compiled = problems(model_family="flux", gradient_checkpointing=True,
                            gradient_checkpointing_interval=1, dynamo_backend="inductor",
                            musubi_blocks_to_swap=1, fsdp_enable=True)
        self.assertIn("dynamo_backend' ('inductor') compiles each block, and "
                      "musubi_blocks_to_swap puts", compiled)
        self.assertIn("and fsdp_enable puts FSDP2's gathered shards", compiled)
        self.assertIn("SimpleTuner's dynamo_backend 'aot_eager' is not supported here; use "
                      "'inductor'", problems(model_family="flux", dynamo_backend="aot_eager",
                                             gradient_checkpointing=True))
        config = folder / "config.json"
        config.write_text(json.dumps({
            "model_family": "flux", "pretrained_model_name_or_path": "builtin:tiny-flux",
            "output_dir": str(folder / "out"), "data_backend_config": str(folder / "backend.json"),
            "gradient_checkpointing_interval": 0}))  # SimpleTuner's "not set"
        self.assertEqual(load_configuration(str(config)).training.gradient_checkpointing_interval,
                         1)


if __name__ == "__main__":
    unittest.main()
