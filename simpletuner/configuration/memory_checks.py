"""Checks across the memory options that loading config.json runs: block swap against the
family, gradient checkpointing and the launch; group offload against the frozen components'
placement, and its disk folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import known_spec


def check_block_swap_options(values: dict[str, Any], where: Location,
                             problems: list[Problem]) -> None:
    count = values.get("musubi_blocks_to_swap", 0)
    if not count:
        return
    key = f"key 'musubi_blocks_to_swap' ({count})"
    spec = known_spec(values.get("model_family"))
    if spec is not None and spec.trains_unet:
        problems.append(where.problem(
            "musubi_blocks_to_swap", f"{key} swaps transformer blocks; model_family "
            f"'{values['model_family']}' is a UNet: set it to 0"))
    if not values.get("gradient_checkpointing", False):
        problems.append(where.problem(
            "musubi_blocks_to_swap", f"{key} needs gradient_checkpointing true: without it "
            "autograd keeps every swapped block's device copy until the backward, so nothing is "
            "saved"))
    if values.get("fsdp_enable", False):
        problems.append(where.problem(
            "musubi_blocks_to_swap", f"{key} and fsdp_enable both take weights off the device; "
            "with several processes FSDP2 shards them: set musubi_blocks_to_swap to 0"))
    elif values.get("num_processes", 1) > 1:
        problems.append(where.problem(
            "musubi_blocks_to_swap", f"{key} is for one process; with {values['num_processes']} "
            "processes use fsdp_enable (sharding) or num_processes 1"))


def check_group_offload_options(values: dict[str, Any], where: Location, base: Path,
                                problems: list[Problem]) -> None:
    """``base``: the folder a relative group_offload_to_disk_path is taken from."""
    if not values.get("enable_group_offload", False):
        return
    if values.get("frozen_components_after_caching", "offload") == "free":
        problems.append(where.problem(
            "frozen_components_after_caching", "key 'frozen_components_after_caching' is 'free', "
            "but enable_group_offload keeps the VAE and text encoders on the host already and "
            "its hooks hold their weights: set it to 'offload'"))
    folder = values.get("group_offload_to_disk_path")
    for key in (f"text_encoder_{number}_precision" for number in range(1, 5)):
        precision = values.get(key, "no_change")
        if precision.endswith("-quanto"):
            problems.append(where.problem(
                key, f"key '{key}' is '{precision}': optimum-quanto's weights do not survive "
                "diffusers' group offload (SimpleTuner says the same): use a torchao or bnb "
                "precision, or enable_group_offload false"))
        elif precision != "no_change" and folder is not None:
            problems.append(where.problem(
                key, f"key '{key}' is '{precision}': a quantized text encoder cannot be written "
                "to group_offload_to_disk_path as safetensors: remove group_offload_to_disk_path "
                "(host memory) or set it to 'no_change'"))
    if folder is not None:
        problem = folder_write_problem(base / os.path.expanduser(folder))
        if problem:
            problems.append(where.problem(
                "group_offload_to_disk_path", f"key 'group_offload_to_disk_path' ({folder}) "
                f"{problem}: name a folder this user can write, on a fast local disk"))


def folder_write_problem(folder: Path) -> str | None:
    """Why ``folder`` could not be created or written, if it could not: its nearest existing
    part must be a folder this user may write into."""
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be created: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be written: {existing} is not writable"
    return None
