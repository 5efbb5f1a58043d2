"""Checks of config.json's options against each other: options the chosen family would
ignore, Chroma's flux_lora_target 'all', and what FSDP2 needs."""

from __future__ import annotations

from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import FLOW_FAMILIES
from simpletuner.configuration.fields import normalise_key


def check_loss_options_fit_the_family(values: dict[str, Any], where: Location,
                                       problems: list[Problem]) -> None:
    """An option the chosen family would ignore is a mistake to report, not to drop silently."""
    family = values.get("model_family")
    if family is None:
        return
    if family in FLOW_FAMILIES and values.get("snr_gamma") is not None:
        problems.append(where.problem(
            "snr_gamma", "key 'snr_gamma' applies to the noise-prediction families (sd1x, sd2x, "
            f"sdxl); model_family '{family}' trains with flow matching, where Min-SNR weighting "
            "does not exist. Remove it (flow_timestep_sampling and flow_shift shape that loss)."))
    flow_keys = sorted(key for key in values if key.startswith("flow_"))
    if family not in FLOW_FAMILIES and flow_keys:
        problems.append(where.problem(
            flow_keys[0], f"{', '.join(repr(k) for k in flow_keys)} apply to the flow-matching "
            f"families ({', '.join(FLOW_FAMILIES)}); model_family '{family}' would ignore them. "
            "Remove them."))
    if family not in ("flux", "flux2") and "flux_guidance_value" in values:
        problems.append(where.problem(
            "flux_guidance_value", "key 'flux_guidance_value' applies to model_families 'flux' "
            f"and 'flux2' only; '{family}' has no guidance input. Remove it."))


def check_chroma_lora_target(raw: dict, values: dict[str, Any], where: Location,
                              problems: list[Problem]) -> None:
    """flux_lora_target 'all' is accepted as the family's default targets, which for Chroma (as
    in SimpleTuner) leave out the text-stream projections that SimpleTuner's 'all' adds."""
    if (values.get("model_family") != "chroma" or values.get("model_type") != "lora"
            or values.get("lora_target_modules")):
        return
    if {normalise_key(key): value for key, value in raw.items()}.get("flux_lora_target") == "all":
        problems.append(where.problem(
            "flux_lora_target", "key 'flux_lora_target' 'all' adapts more of Chroma than its "
            "default (to_q, to_k, to_v, to_out.0); set lora_target_modules to "
            '["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", '
            '"to_add_out"] for SimpleTuner\'s \'all\''))


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
