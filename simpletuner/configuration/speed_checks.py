"""Checks of the speed options that loading config.json runs: gradient_checkpointing_interval
against checkpointing, the family and block swap; dynamo_backend against block swap and
FSDP2; tread_config's routes against the family and dynamo_backend."""

from __future__ import annotations

from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import families_where, known_spec
from simpletuner.families import spoken_list


def check_checkpointing_interval(values: dict[str, Any], where: Location,
                                 problems: list[Problem]) -> None:
    interval = values.get("gradient_checkpointing_interval", 1)
    if interval == 1:
        return
    if not values.get("gradient_checkpointing", False):
        return  # it chooses which blocks checkpointing recomputes: without it, it asks nothing
    key = f"key 'gradient_checkpointing_interval' ({interval})"
    spec = known_spec(values.get("model_family"))
    if spec is not None and spec.trains_unet:
        problems.append(where.problem(
            "gradient_checkpointing_interval", f"{key} counts transformer blocks; model_family "
            f"'{values['model_family']}' is a UNet: set it to 1"))
    if values.get("musubi_blocks_to_swap", 0):
        problems.append(where.problem(
            "gradient_checkpointing_interval", f"{key} leaves blocks unrecomputed, and block "
            "swap needs every swapped block checkpointed (its device copies would be kept "
            "until the backward): set it to 1, or musubi_blocks_to_swap to 0"))


def check_compile_options(values: dict[str, Any], where: Location,
                          problems: list[Problem]) -> None:
    """Regional compilation works with LoRA and gradient checkpointing; block swap's hooks
    replace a block's weights around its forward, and FSDP2's gather them, inside what would
    be the compiled region: refused, by name, rather than recompiled at every call."""
    backend = values.get("dynamo_backend", "no")
    if backend == "no":
        return
    key = f"key 'dynamo_backend' ('{backend}')"
    for other, what in (("musubi_blocks_to_swap", "block swap's weight copies"),
                        ("fsdp_enable", "FSDP2's gathered shards")):
        if values.get(other):
            problems.append(where.problem(
                "dynamo_backend", f"{key} compiles each block, and {other} puts {what} in "
                f"the blocks' forward, which compiling here does not support: set dynamo_backend "
                f"to 'no', or {other} off"))


def check_tread_config(values: dict[str, Any], where: Location,
                       problems: list[Problem]) -> None:
    """tread_config's shape (its block range is checked against the network when it loads),
    the family and dynamo_backend."""
    config = values.get("tread_config")
    if config is None:
        return
    routes = config.get("routes")
    shown = ("'routes' is not a list" if not isinstance(routes, list)
             else next(filter(None, map(_route_problem, routes)), None))
    if shown:
        problems.append(where.problem(
            "tread_config", "key 'tread_config' needs {\"routes\": [{\"selection_ratio\": 0.5, "
            f"\"start_layer_idx\": 2, \"end_layer_idx\": -2}}, ...]}}: {shown}"))
    spec = known_spec(values.get("model_family"))
    if spec is not None and not spec.token_routing:
        routed = spoken_list(families_where(lambda spec: spec.token_routing), "'")
        problems.append(where.problem(
            "tread_config", f"key 'tread_config' routes tokens of model_families {routed}; "
            f"'{values['model_family']}' does not: remove it"))
    if values.get("dynamo_backend", "no") != "no":
        problems.append(where.problem(
            "tread_config", "key 'tread_config' changes the blocks' token counts every step, "
            "which compiled blocks would recompile for: set dynamo_backend to 'no', or remove "
            "tread_config"))


def _route_problem(route: Any) -> str | None:
    if not isinstance(route, dict):
        return f"{route!r} is not an object"
    ratio = route.get("selection_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        return f"selection_ratio {ratio!r} is not a number from 0 up to (not including) 1"
    for key in ("start_layer_idx", "end_layer_idx"):
        if isinstance(route.get(key), bool) or not isinstance(route.get(key), int):
            return f"{key} {route.get(key)!r} is not a whole number"
    return None
