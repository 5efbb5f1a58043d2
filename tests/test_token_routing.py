"""TREAD (tread_config) on Flux and Wan: while training, the routed share of the image tokens
skips the routed blocks (the tokens each block sees, counted), also under gradient
checkpointing, and the loss still falls; without grad (validation, evaluation) every block
sees every token and the loss is the one without TREAD, for the same weights."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import torch

from model_fixtures import TinyModelCase, losses_around_training, random_batch
from simpletuner.families import family_spec
from simpletuner.models.token_routing import resolve_routes
from training_fixtures import config_problems

ROUTES = {"routes": [{"selection_ratio": 0.5, "start_layer_idx": 1, "end_layer_idx": -2}]}


class TokenRoutingTest(TinyModelCase):
    def routed_adapter(self, family: str):
        """builtin:tiny-<family> with three blocks per block list, routed by ROUTES."""
        adapter = self.load(family)
        network = adapter.transformer
        torch.manual_seed(0)
        adapter.transformer = type(network).from_config(
            {**network.config, **{key: 3 for key in family_spec(family).swappable_block_keys}})
        adapter.route_tokens(ROUTES)
        return adapter

    def tokens_seen(self, adapter, batch, *, grad: bool) -> list[int]:
        """Image tokens each block got in one compute_loss (after the router's hooks)."""
        seen = []

        def count(block, args, kwargs):
            tokens = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            seen.append(tokens.shape[1])

        blocks = adapter.swappable_blocks(adapter.transformer)
        hooks = [block.register_forward_pre_hook(count, with_kwargs=True) for block in blocks]
        with torch.set_grad_enabled(grad):
            adapter.compute_loss(batch, torch.Generator().manual_seed(3))
        for hook in hooks:
            hook.remove()
        return seen

    def assert_routes(self, family: str, blocks: int) -> None:
        adapter = self.routed_adapter(family)
        batch = random_batch(adapter, 2)
        routed = [16] + [8] * (blocks - 2) + [16]  # 64 px: 16 image tokens, half routed
        self.assertEqual(self.tokens_seen(adapter, batch, grad=True), routed)
        self.assertEqual(self.tokens_seen(adapter, batch, grad=False), [16] * blocks)
        with torch.no_grad():
            loss = adapter.compute_loss(batch, torch.Generator().manual_seed(5))
            adapter.token_router.remove()
            unrouted = adapter.compute_loss(batch, torch.Generator().manual_seed(5))
        self.assertEqual(loss.item(), unrouted.item())
        adapter.route_tokens(ROUTES)
        adapter.set_gradient_checkpointing(True)  # recomputed blocks route as their forward
        self.assertEqual(self.tokens_seen(adapter, batch, grad=True), routed)
        before, after = losses_around_training(adapter, batch, lr=1e-3, steps=4)
        self.assertLess(after, before)

    def test_flux_routes_image_tokens_around_the_middle_blocks(self):
        self.assert_routes("flux", 6)  # double-stream blocks 0-2, then single-stream 3-5

    def test_wan_routes_video_tokens_around_the_middle_blocks(self):
        self.assert_routes("wan", 3)

    def test_routes_are_resolved_against_the_block_count(self):
        routes = resolve_routes(ROUTES, 6)
        self.assertEqual([(r.start, r.end, r.selection_ratio) for r in routes], [(1, 4, 0.5)])
        with self.assertRaisesRegex(ValueError, "not a range of this network's 2 blocks"):
            resolve_routes(ROUTES, 2)

    def test_what_cannot_work_is_refused_before_launch(self):
        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))

        def problems(**options) -> str:
            return config_problems(folder, pretrained_model_name_or_path="builtin:tiny-flux",
                                   **options)

        text = problems(model_family="sd3", dynamo_backend="inductor", tread_config={
            "routes": [{"selection_ratio": 1.5, "start_layer_idx": 1, "end_layer_idx": -1}]})
        self.assertIn("selection_ratio 1.5 is not a number from 0 up to (not including) 1", text)
        self.assertIn("routes tokens of model_families 'flux' and 'wan'; 'sd3' does not", text)
        self.assertIn("which compiled blocks would recompile for", text)
        self.assertIn("'routes' is not a list",
                      problems(model_family="flux", tread_config={"route": []}))


if __name__ == "__main__":
    unittest.main()
