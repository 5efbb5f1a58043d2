"""Checks of config.json's options against each other: options the chosen family would
ignore, flux_lora_target 'all' where it means more than the default (Chroma), what FSDP2
needs, context_parallel_size against num_processes, and what controlnet needs of the family
and model_type."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import FLOW_FAMILIES, families_where, known_spec
from simpletuner.configuration.fields import normalise_key
from simpletuner.configuration.simpletuner_options import CONFIG_JSON
from simpletuner.families import spoken_list
from simpletuner.families.spec import NOISE
from simpletuner.helpers.metadata.mesh import mesh_problem


def check_loss_options_fit_the_family(values: dict[str, Any], where: Location,
                                       problems: list[Problem]) -> None:
    """An option the chosen family would ignore is a mistake to report, not to drop silently."""
    family = values.get("model_family")
    if family is None:
        return
    if family in FLOW_FAMILIES and values.get("snr_gamma") is not None:
        noise = ", ".join(families_where(lambda spec: spec.objective == NOISE))
        problems.append(where.problem(
            "snr_gamma", f"key 'snr_gamma' applies to the noise-prediction families ({noise}); "
            f"model_family '{family}' trains with flow matching, where Min-SNR weighting "
            "does not exist. Remove it (flow_timestep_sampling and flow_shift shape that loss)."))
    flow_keys = sorted(key for key in values if key.startswith("flow_"))
    if family not in FLOW_FAMILIES and flow_keys:
        problems.append(where.problem(
            flow_keys[0], f"{', '.join(repr(k) for k in flow_keys)} apply to the flow-matching "
            f"families ({', '.join(FLOW_FAMILIES)}); model_family '{family}' would ignore them. "
            "Remove them."))
    spec = known_spec(family)
    if not (spec and spec.guidance_input) and "flux_guidance_value" in values:
        guided = spoken_list(families_where(lambda spec: spec.guidance_input), "'")
        problems.append(where.problem(
            "flux_guidance_value", f"key 'flux_guidance_value' applies to model_families "
            f"{guided} only; '{family}' has no guidance input. Remove it."))


def with_lora_target_preset(raw: dict) -> dict:
    """``raw`` (config.json's options) with SimpleTuner's flux_lora_target read as the
    lora_target_modules it names, for a family whose spec has that preset (Flux); as in
    SimpleTuner, lora_target_modules (peft_lora_target_modules) given too wins. Any other value
    stays, for the refusal."""
    options = {normalise_key(key): (key, value) for key, value in raw.items()}
    spec = known_spec(options.get("model_family", (None, None))[1])
    key, preset = options.get("flux_lora_target", (None, None))
    if spec is None or not isinstance(preset, str) or preset not in spec.lora_target_presets:
        return raw
    given = {CONFIG_JSON.canonical(name) for name in options}
    rest = {k: v for k, v in raw.items() if k != key}
    if "lora_target_modules" in given:
        return rest
    return {**rest, "lora_target_modules": list(spec.lora_target_presets[preset])}


def check_lora_target_all(raw: dict, values: dict[str, Any], where: Location,
                          problems: list[Problem]) -> None:
    """flux_lora_target 'all' is accepted as the family's default targets; a family whose spec
    says they are less than SimpleTuner's 'all' (Chroma) gets the problem."""
    spec = known_spec(values.get("model_family"))
    if (spec is None or spec.lora_target_all_problem is None
            or values.get("model_type") != "lora" or values.get("lora_target_modules")):
        return
    if {normalise_key(key): value for key, value in raw.items()}.get("flux_lora_target") == "all":
        problems.append(where.problem(
            "flux_lora_target", f"key 'flux_lora_target' 'all' {spec.lora_target_all_problem}"))


def check_fsdp_options(values: dict[str, Any], where: Location, problems: list[Problem]) -> None:
    if not values.get("fsdp_enable", False):
        return
    if values.get("fsdp_version", 2) != 2:
        problems.append(where.problem(
            "fsdp_version", f"fsdp_version {values['fsdp_version']} is not supported",
            "use fsdp_version 2 (torch's fully_shard), the only FSDP here"))
    if values.get("mixed_precision") == "fp16":
        problems.append(where.problem(
            "mixed_precision", "fsdp_enable needs mixed_precision 'bf16' or 'no'; fp16's loss "
            "scaler does not handle sharded gradients"))


def check_context_parallel_options(values: dict[str, Any], where: Location,
                                   problems: list[Problem]) -> None:
    """context_parallel_size must divide num_processes where config.json sets it (SimpleTuner's
    configs leave it to the launcher; every rank checks it against the processes started)."""
    size = values.get("context_parallel_size", 1)
    problem = mesh_problem(values["num_processes"], size) if "num_processes" in values else None
    if problem:
        problems.append(where.problem("context_parallel_size", problem))
    if size == 1:
        return
    spec = known_spec(values.get("model_family"))
    if spec is not None and spec.attention_heads_key is None:
        problems.append(where.problem(
            "context_parallel_size", f"context_parallel_size {size}: model_family "
            f"'{spec.name}' has no sequence-parallel attention here (it has for "
            f"{spoken_list(families_where(lambda s: s.attention_heads_key))})",
            "set context_parallel_size to 1"))
    if values.get("fsdp_enable", False):
        problems.append(where.problem(
            "context_parallel_size", f"context_parallel_size {size} with fsdp_enable is not "
            "supported yet", "use one of them"))
def check_controlnet_options(values: dict[str, Any], where: Location, base: Path,
                             problems: list[Problem]) -> None:
    """controlnet: true for a family whose spec trains ControlNets, a full one;
    controlnet_model_name_or_path (taken from ``base`` when relative) only with it, a folder
    with a config.json."""
    start = values.get("controlnet_model_name_or_path")
    if not values.get("controlnet", False):
        if start is not None:
            problems.append(where.problem(
                "controlnet_model_name_or_path", "key 'controlnet_model_name_or_path' is the "
                "ControlNet a controlnet run starts from; set controlnet: true, or remove it"))
        return
    if start is not None and not (base / os.path.expanduser(start) / "config.json").is_file():
        problems.append(where.problem(
            "controlnet_model_name_or_path", f"key 'controlnet_model_name_or_path' is {start!r}, "
            "which is not a diffusers ControlNet folder (no config.json there); give the folder "
            "(e.g. an export's pipeline/controlnet), or remove it to start from the base network"))
    family = values.get("model_family")
    spec = known_spec(family)
    if spec is not None and spec.controlnet_adapter is None:
        trained = spoken_list(families_where(lambda spec: spec.controlnet_adapter is not None),
                              "'")
        problems.append(where.problem(
            "controlnet", f"SimpleTuner option 'controlnet' is not supported here for "
            f"model_family '{family}'; ControlNets train for model_family {trained}"))
    elif values.get("musubi_blocks_to_swap"):
        problems.append(where.problem(
            "musubi_blocks_to_swap", "key 'musubi_blocks_to_swap' moves the trained network's "
            "blocks, and a controlnet run trains the ControlNet beside the frozen network; "
            "remove it (gradient_checkpointing saves memory here)"))
    elif values.get("model_type", "full") != "full":
        problems.append(where.problem(
            "controlnet", "SimpleTuner option 'controlnet' is not supported here with model_type "
            f"'{values['model_type']}' (ControlNet-LoRA); set model_type 'full' to train the "
            "whole ControlNet"))
