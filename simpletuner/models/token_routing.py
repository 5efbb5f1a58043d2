"""TREAD token routing (SimpleTuner's ``tread_config``), while training only: for each route, a
``selection_ratio`` share of the image tokens skips the blocks ``start_layer_idx`` through
``end_layer_idx`` (inclusive; negative indices count from the end of the network's block
list, as SimpleTuner's Flux counts double- then single-stream blocks), and rejoins unchanged
after the last of them; the other tokens go through. The routed blocks see fewer tokens, so a
step costs less, and every token still gets its loss.

Hooks on the blocks do it, whatever calls them (diffusers' forward, gradient checkpointing,
Chroma-style wrapping): the first block of a route takes the kept tokens (and the family's
token-aligned inputs, its rotary embedding), every block of the route gets those, and the last
one's output is scattered back into the full sequence. The family says where the tokens are in
a block's arguments and output (``TokenLayout``). One selection for the batch, drawn per
forward from a seed the step's noise generator gives (``reseed``), so a resumed run routes as
the uninterrupted one, and the recomputation of a checkpointed block routes as its forward did.
Inactive without grad or in eval mode: validation and evaluation see every block."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Route:
    selection_ratio: float  # the share of image tokens that skips the route's blocks
    start: int              # first and last routed block, non-negative, inclusive
    end: int


def resolve_routes(tread_config: dict, block_count: int) -> list[Route]:
    """tread_config's routes, their indices made non-negative; a ValueError names what is
    wrong (configuration checks the shape before launch, this the network's block count)."""
    routes = []
    for number, route in enumerate(tread_config.get("routes", [])):
        start, end = (index + block_count if index < 0 else index
                      for index in (route["start_layer_idx"], route["end_layer_idx"]))
        if not 0 <= start <= end < block_count:
            raise ValueError(
                f"tread_config route {number}: blocks {route['start_layer_idx']} to "
                f"{route['end_layer_idx']} are not a range of this network's {block_count} "
                "blocks (negative indices count from the end)")
        if routes and start <= routes[-1].end:
            raise ValueError(f"tread_config route {number} overlaps the route before it")
        routes.append(Route(float(route["selection_ratio"]), start, end))
    return routes


@dataclass(frozen=True)
class TokenLayout:
    """Where a family's blocks hold the image tokens: the argument with them (dimension 1),
    the token-aligned arguments and how to route each (``route(value, keep, count)``: the kept
    token indices of ``count``), and which item of a tuple output holds them (None: the output
    is the tokens)."""
    tokens: str
    aligned: dict[str, Callable[[Any, torch.Tensor, int], Any]]
    output_item: int | None = None


class TokenRouter:
    """The hooks of ``routes`` over ``blocks`` (the network's block list, in order)."""

    def __init__(self, network: torch.nn.Module, blocks: list[torch.nn.Module],
                 routes: list[Route], layout: TokenLayout):
        self.network, self.blocks, self.routes, self.layout = network, blocks, routes, layout
        self.seed = 0
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # route: (keep, full)
        self.handles = [network.register_forward_pre_hook(lambda *_: self.kept.clear())]
        for number, route in enumerate(routes):
            for index in range(route.start, route.end + 1):
                self.handles.append(blocks[index].register_forward_pre_hook(
                    lambda block, args, kwargs, n=number, i=index: self._enter(n, i, block,
                                                                                args, kwargs),
                    with_kwargs=True))
            self.handles.append(blocks[route.end].register_forward_hook(
                lambda block, args, output, n=number: self._leave(n, output)))

    def reseed(self, generator: torch.Generator | None) -> None:
        """The next forward's selection, from the step's noise generator."""
        device = generator.device if generator is not None else "cpu"
        self.seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _active(self) -> bool:
        return self.network.training and torch.is_grad_enabled()

    def _enter(self, number: int, index: int, block, args, kwargs):
        if not self._active():
            return None
        bound = inspect.signature(type(block).forward).bind(block, *args, **kwargs)
        values = dict(bound.arguments)
        values.pop("self")
        tokens = values[self.layout.tokens]
        if index == self.routes[number].start:
            if number not in self.kept:  # a checkpointed block's recomputation: the same
                self.kept[number] = (self._selection(number, tokens), tokens)
            values[self.layout.tokens] = tokens[:, self.kept[number][0]]
        keep, full = self.kept[number]
        for name, route in self.layout.aligned.items():
            if values.get(name) is not None:
                values[name] = route(values[name], keep, full.shape[1])
        return (), values

    def _selection(self, number: int, tokens: torch.Tensor) -> torch.Tensor:
        count = tokens.shape[1]
        kept = count - int(round(count * self.routes[number].selection_ratio))
        generator = torch.Generator().manual_seed(self.seed + number)
        return torch.randperm(count, generator=generator)[:max(kept, 1)].sort().values.to(
            tokens.device)

    def _leave(self, number: int, output):
        if not self._active() or number not in self.kept:
            return None
        keep, full = self.kept[number]
        item = self.layout.output_item
        routed = output if item is None else output[item]
        restored = full.clone()
        restored[:, keep] = routed
        if item is None:
            return restored
        return (*output[:item], restored, *output[item + 1:])
