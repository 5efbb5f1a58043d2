"""Checks across the memory options that loading config.json runs: block swap against the
family, gradient checkpointing and the launch."""

from __future__ import annotations

from typing import Any

from simpletuner.configuration.families import UNET_FAMILIES


def check_block_swap_options(values: dict[str, Any], where: str, problems: list[str]) -> None:
    count = values.get("musubi_blocks_to_swap", 0)
    if not count:
        return
    key = f"{where}: key 'musubi_blocks_to_swap' ({count})"
    if values.get("model_family") in UNET_FAMILIES:
        problems.append(f"{key} swaps transformer blocks; model_family "
                        f"'{values['model_family']}' is a UNet: set it to 0")
    if not values.get("gradient_checkpointing", False):
        problems.append(f"{key} needs gradient_checkpointing true: without it autograd keeps "
                        "every swapped block's device copy until the backward, so nothing is "
                        "saved")
    if values.get("fsdp_enable", False):
        problems.append(f"{key} and fsdp_enable both take weights off the device; with several "
                        "processes FSDP2 shards them: set musubi_blocks_to_swap to 0")
    elif values.get("num_processes", 1) > 1:
        problems.append(f"{key} is for one process; with {values['num_processes']} processes "
                        "use fsdp_enable (sharding) or num_processes 1")
