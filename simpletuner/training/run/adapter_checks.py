"""The adapter options checked before launch, torch-free: lora_type 'lycoris' and its
lycoris_config file (its numbers within LyCORIS's ranges, the quantized bases it needs
bypass_mode on), init_lora's file, assistant_lora_path's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import known_spec

LYCORIS_ALGOS = ("lora", "locon", "loha", "lokr", "full")
# What LyCORIS's apply_preset accepts (lycoris.wrapper.VALID_PRESET_KEYS, less the
# text-encoder and unet_ forms create_lycoris's own presets use: text encoders are frozen here).
PRESET_KEYS = ("enable_conv", "target_module", "target_name", "module_algo_map",
               "name_algo_map", "use_fnmatch", "exclude_name")
# Every key lycoris-lora's create_lycoris reads (4.1), and the four SimpleTuner reads itself: any
# other is a typo LyCORIS would silently ignore.
KNOWN_KEYS = ("algo", "multiplier", "linear_dim", "linear_alpha", "apply_preset", "preset",
              "conv_dim", "conv_alpha", "factor", "dropout", "rank_dropout", "module_dropout",
              "block_size", "bypass_mode", "constraint", "constrain", "decompose_both",
              "disable_conv_cp", "dora_wd", "full_matrix", "rescaled", "train_llm_adapter",
              "train_norm", "unbalanced_factorization", "use_conv_cp", "use_cp", "use_scalar",
              "use_tucker", "wd_on_output", "weight_decompose")
# lycoris-lora hands these rates to torch's Dropout (or compares them with torch.rand), which
# takes [0, 1]; at 1 every update is dropped and nothing trains.
RATES = ("dropout", "rank_dropout", "module_dropout")
# The smallest rank LyCORIS builds a module with: a linear layer gets one only for linear_dim
# > 0 (LycorisNetwork's create_modules); conv_dim 0 means linear_dim's, below that no conv module.
SMALLEST_DIMS = {"linear_dim": 1, "conv_dim": 0}
_NUMBERS = ("multiplier", "linear_dim", "linear_alpha", "conv_dim", "conv_alpha", "factor",
            "dropout", "rank_dropout", "module_dropout", "block_size", "constraint")


class LycorisConfigError(ValueError):
    """lycoris_config cannot be read or holds a value LyCORIS would not take."""


def read_lycoris_config(path: str | Path) -> dict[str, Any]:
    """The lycoris_config JSON object, every problem in it named in one LycorisConfigError."""
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LycorisConfigError(f"lycoris_config {path} cannot be read ({exc.strerror}); "
                                 "point it at a JSON file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LycorisConfigError(f"lycoris_config {path} is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise LycorisConfigError(f"lycoris_config {path} must hold a JSON object")
    problems = _config_problems(config)
    if problems:
        raise LycorisConfigError(f"lycoris_config {path}: " + "; ".join(problems))
    return config


def _config_problems(config: dict[str, Any]) -> list[str]:
    problems = []
    unknown = sorted(set(config) - set(KNOWN_KEYS))
    if unknown:
        problems.append(f"keys {unknown} are not LyCORIS options; use {', '.join(KNOWN_KEYS)}")
    algo = config.get("algo")
    if algo not in LYCORIS_ALGOS:
        problems.append(f"'algo' is {algo!r}; use one of {', '.join(LYCORIS_ALGOS)}")
    for key in _NUMBERS:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            problems.append(f"'{key}' is {value!r}; it must be a number")
    preset = config.get("apply_preset", {})
    if not isinstance(preset, dict):
        problems.append("'apply_preset' must be a JSON object")
    else:
        unknown = sorted(set(preset) - set(PRESET_KEYS))
        if unknown:
            problems.append(f"'apply_preset' has keys {unknown} that LyCORIS does not take; "
                            f"use {', '.join(PRESET_KEYS)}")
    if isinstance(config.get("preset"), str) and config["preset"] not in ("full",):
        problems.append("'preset' names a LyCORIS preset; describe the modules in "
                        "'apply_preset' instead")
    return problems


def adapter_problems(training, where: Location) -> list[Problem]:
    """Each problem with the adapter options of ``training`` (a TrainingConfig, in ``where``)."""
    problems = []
    if training.init_lora is not None:
        if training.model_type != "lora":
            problems.append(where.problem(
                "init_lora", f"key 'init_lora' is set but model_type is '{training.model_type}'",
                "set model_type to 'lora'"))
        elif not Path(training.init_lora).is_file():
            problems.append(where.problem(
                "init_lora", f"key 'init_lora': {training.init_lora} is not a file; point it at "
                "a LoRA .safetensors file"))
    problems += _assistant_problems(training, where)
    if training.lora_type != "lycoris":
        if training.lycoris_config is not None and training.model_type == "lora":
            problems.append(where.problem(
                "lycoris_config", "key 'lycoris_config' is set but lora_type is 'standard'",
                "set lora_type to 'lycoris' to use it, or remove it"))
        return problems
    if training.model_type != "lora":
        problems.append(where.problem(
            "lora_type", f"key 'lora_type' is 'lycoris' but model_type is '{training.model_type}'",
            "set model_type to 'lora'"))
    if training.lora_format == "comfyui":
        problems.append(where.problem(
            "lora_format", "key 'lora_format' is 'comfyui', but lora_type 'lycoris' exports "
            "LyCORIS's own file (lycoris_<module> keys, which ComfyUI reads as it is), never "
            "the comfyui layout", "remove lora_format or set it to 'diffusers'"))
    if importlib.util.find_spec("lycoris") is None:
        problems.append(where.problem(
            "lora_type", "lora_type 'lycoris' needs the lycoris-lora library: pip install "
            "'simpletuner[lycoris]'"))
    if training.lycoris_config is None:
        problems.append(where.problem(
            "lycoris_config", "key 'lora_type' is 'lycoris' but lycoris_config is not set; point "
            "it at a JSON file with algo, linear_dim, linear_alpha, ..."))
    else:
        try:
            config = read_lycoris_config(training.lycoris_config)
            problems += [where.problem("lycoris_config", problem) for problem in
                         _quantized_base_problems(training.base_model_precision, config)]
            problems += range_problems(config, Location(training.lycoris_config))
        except LycorisConfigError as exc:
            problems.append(where.problem("lycoris_config", f"key 'lycoris_config': {exc}"))
    return problems


def _assistant_problems(training, where: Location) -> list[Problem]:
    """assistant_lora_path: a file, or a folder with its weight file, on a standard LoRA run."""
    path = training.assistant_lora_path
    if path is None or training.disable_assistant_lora:
        return []
    key = "assistant_lora_path"
    if training.model_type != "lora" or training.lora_type != "standard":
        return [where.problem(key, f"key '{key}' is set but model_type is "
                              f"'{training.model_type}' and lora_type '{training.lora_type}'; "
                              "the assistant LoRA is applied beside a standard LoRA only",
                              "set model_type 'lora' and lora_type 'standard', or remove it")]
    if training.fsdp_enable:
        return [where.problem(key, f"key '{key}' with fsdp_enable: the sharded network holds "
                              "the run's adapter only", "remove one of them")]
    file = Path(path)
    if file.is_dir():
        name = training.assistant_lora_weight_name
        if name is not None:
            file = file / name
        elif len(list(file.glob("*.safetensors"))) != 1:
            return [where.problem(key, f"key '{key}': {path} is a folder without exactly one "
                                  ".safetensors file", "set assistant_lora_weight_name to the "
                                  "file in it, or point assistant_lora_path at the file")]
    if not file.exists():
        return [where.problem(key, f"key '{key}': {file} does not exist; point it at the "
                              "assistant's LoRA .safetensors file (nothing is downloaded)")]
    return []


def assistant_warnings(training) -> list[str]:
    """A flavour SimpleTuner trains with an assistant LoRA by default, without one here."""
    spec = known_spec(training.model_family)
    default = spec.default_assistants.get(training.model_flavour) if spec else None
    if (default is None or training.model_type != "lora" or training.disable_assistant_lora
            or training.assistant_lora_path is not None):
        return []
    return [f"model_flavour '{training.model_flavour}': SimpleTuner trains a LoRA on it with "
            f"its assistant LoRA ({default}) unless disable_assistant_lora; nothing is "
            "downloaded here, so this run trains without one. Download it and set "
            "assistant_lora_path (and assistant_lora_weight_name) to keep the distillation, "
            "or set disable_assistant_lora: true to silence this"]


def range_problems(config: dict[str, Any], where: Location) -> list[Problem]:
    """lycoris_config's numbers outside what LyCORIS builds a working adapter from, each at
    its key in the lycoris_config file (``where``)."""
    problems = []
    for key in RATES:
        value = config.get(key)
        if isinstance(value, (int, float)) and not 0 <= value < 1:
            problems.append(where.problem(
                key, f"'{key}' is {value}; a dropout rate must be at least 0 and below 1",
                f"set {key} to a rate such as 0.1, or 0 for none"))
    for key, smallest in SMALLEST_DIMS.items():
        value = config.get(key)
        if isinstance(value, (int, float)) and (not float(value).is_integer() or value < smallest):
            problems.append(where.problem(
                key, f"'{key}' is {value}; LyCORIS takes a whole number of at least {smallest} "
                "(the adapter's rank)", f"set {key} to a rank such as 16"))
    return problems


def _quantized_base_problems(precision: str, config: dict) -> list[str]:
    """LyCORIS adds its update to the layer's weight unless bypass_mode; torchao's quantized
    weights take no addition, so they need bypass_mode (LyCORIS itself turns bypass mode on
    for the quanto and bitsandbytes layers it knows)."""
    if precision.endswith("-torchao") and str(config.get("bypass_mode")).lower() != "true":
        return [f"lora_type 'lycoris' on a base_model_precision '{precision}' base needs "
                "\"bypass_mode\": true in lycoris_config (torchao's weights cannot take "
                "LyCORIS's weight update; bypass mode adds its output instead)"]
    return []
