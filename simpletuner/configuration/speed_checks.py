"""Checks of the speed options that loading config.json runs: gradient_checkpointing_interval
against checkpointing, the family and block swap; dynamo_backend against block swap and
FSDP2."""

from __future__ import annotations

from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import known_spec


def check_checkpointing_interval(values: dict[str, Any], where: Location,
                                 problems: list[Problem]) -> None:
    interval = values.get("gradient_checkpointing_interval", 1)
    if interval == 1:
        return
    key = f"key 'gradient_checkpointing_interval' ({interval})"
    if not values.get("gradient_checkpointing", False):
        problems.append(where.problem(
            "gradient_checkpointing_interval", f"{key} chooses which blocks gradient "
            "checkpointing recomputes, but gradient_checkpointing is off: set it true, or the "
            "interval to 1"))
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
