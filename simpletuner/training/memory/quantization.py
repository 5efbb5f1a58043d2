"""Quantized frozen weights by SimpleTuner's precision names, through the libraries peft wraps
with LoRA layers: torchao, optimum-quanto and bitsandbytes. The network under a LoRA
(``base_model_precision``) and each text encoder (``text_encoder_<n>_precision``) can be
quantized; the LoRA itself stays in float (peft adds it beside the quantized base layer), so the
export is a plain diffusers LoRA that loads onto the unquantized base pipeline.

Each library is imported only when its precision is asked for."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from simpletuner.training.settings import PrecisionSettings

logger = logging.getLogger(__name__)

QUANTIZATION_INSTALL = "pip install 'simpletuner[quantization]'"


def _torchao_int8(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    quantize_(module, Int8WeightOnlyConfig())


def _torchao_fp8(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    from torchao.quantization import Float8WeightOnlyConfig, quantize_
    quantize_(module, Float8WeightOnlyConfig())


def _quanto(weights: str) -> Callable[[torch.nn.Module, torch.dtype], None]:
    def quantize_with_quanto(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
        from optimum import quanto
        quanto.quantize(module, weights=getattr(quanto, weights))
        quanto.freeze(module)  # keep only the quantized weights, not the float originals
    return quantize_with_quanto


def nf4_linears(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, name, layer) of each Linear nf4-bnb replaces: all but bitsandbytes' own and
    what the model keeps in float32 (``_keep_in_fp32_modules``: Wan's time embedder casts its
    input to its weight's dtype), which diffusers' and transformers' own bitsandbytes loading
    leave as they are too."""
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    found = []
    for path, parent in module.named_modules():
        if keep & set(path.split(".")):
            continue
        found += [(parent, name, child) for name, child in parent.named_children()
                  if isinstance(child, torch.nn.Linear) and name not in keep
                  and not type(child).__module__.startswith("bitsandbytes")]
    return found


def _bnb_nf4(module: torch.nn.Module, compute_dtype: torch.dtype) -> None:
    """Each of nf4_linears becomes a bitsandbytes LinearNF4, quantized as it moves to its
    device (LyCORIS knows that class and adds its output in bypass mode)."""
    import bitsandbytes as bnb
    for parent, name, child in nf4_linears(module):
        setattr(parent, name, _nf4_linear(child, compute_dtype, bnb))


def _nf4_linear(linear: torch.nn.Linear, compute_dtype: torch.dtype, bnb) -> torch.nn.Module:
    replacement = bnb.nn.LinearNF4(linear.in_features, linear.out_features,
                                   bias=linear.bias is not None, compute_dtype=compute_dtype)
    replacement.weight = bnb.nn.Params4bit(linear.weight.data.cpu(), requires_grad=False,
                                           quant_type="nf4")
    if linear.bias is not None:
        replacement.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
    return replacement.to(linear.weight.device)


def _nf4_runs_here() -> bool:
    """CUDA, or a bitsandbytes whose CPU backend quantizes and runs NF4 layers (older releases
    quantize on CUDA only): a 64x64 layer is quantized and run to find out."""
    if torch.cuda.is_available():
        return True
    layer = torch.nn.Sequential(torch.nn.Linear(64, 64))
    try:
        _bnb_nf4(layer, torch.float32)
        with torch.no_grad():
            output = layer(torch.ones(1, 64))
    except (RuntimeError, NotImplementedError, AssertionError, AttributeError, TypeError):
        return False
    return bool(getattr(layer[0].weight, "bnb_quantized", False)) and bool(
        torch.isfinite(output).all())


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@dataclass(frozen=True)
class PrecisionSpec:
    quantize: Callable[[torch.nn.Module, torch.dtype], None]
    module: str                          # the import it needs
    device_ok: Callable[[], bool]        # whether this machine can run it
    device_need: str                     # what device_ok asks for, in words


def _anywhere() -> bool:
    return True


PRECISIONS: dict[str, PrecisionSpec] = {
    "int8-torchao": PrecisionSpec(_torchao_int8, "torchao", _anywhere, ""),
    "fp8-torchao": PrecisionSpec(_torchao_fp8, "torchao", _fp8_capable,
                                 "a CUDA device of compute capability 8.9 or newer (Ada, Hopper)"),
    "int8-quanto": PrecisionSpec(_quanto("qint8"), "optimum.quanto", _anywhere, ""),
    "int4-quanto": PrecisionSpec(_quanto("qint4"), "optimum.quanto", _anywhere, ""),
    "nf4-bnb": PrecisionSpec(_bnb_nf4, "bitsandbytes", _nf4_runs_here,
                             "a CUDA device, or a bitsandbytes whose CPU backend runs NF4 "
                             "(pip install -U bitsandbytes)"),
}


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent package ("optimum") is missing
        return False


def precision_keys(settings: PrecisionSettings) -> dict[str, str]:
    """{config key: precision} of every quantized part the config asks for."""
    keys = {"base_model_precision": settings.base_model_precision}
    for number in range(1, 4):
        keys[f"text_encoder_{number}_precision"] = settings.text_encoder_precision(number)
    return {key: value for key, value in keys.items() if value != "no_change"}


def precision_problems(settings: PrecisionSettings, text_encoder_count: int) -> list[str]:
    """Every precision this machine, this install or this config cannot honour."""
    problems = []
    for key, precision in precision_keys(settings).items():
        spec = PRECISIONS[precision]
        if key == "base_model_precision" and settings.model_type != "lora":
            problems.append(f"key '{key}' is '{precision}': a quantized network cannot be "
                            "fully fine-tuned; set model_type to 'lora' or use 'no_change'")
        if key.startswith("text_encoder_") and int(key.split("_")[2]) > text_encoder_count:
            problems.append(f"key '{key}' is '{precision}', but {settings.model_family} has "
                            f"{text_encoder_count} text encoder(s)")
        if not _module_available(spec.module):
            problems.append(f"key '{key}' is '{precision}', which needs the {spec.module} "
                            f"package: {QUANTIZATION_INSTALL}")
        elif not spec.device_ok():
            problems.append(f"key '{key}' is '{precision}', which needs {spec.device_need}; "
                            "use 'int8-torchao' or 'int8-quanto' on this machine")
    return problems


def quantize_frozen_weights(adapter, settings: PrecisionSettings, compute_dtype: torch.dtype) -> None:
    """Quantize what the config asks for, in place: the network under a LoRA (frozen first,
    the LoRA is added afterwards) and the text encoders. ``compute_dtype`` is the frozen
    weights' dtype: a LoRA run's network is cast to it first (no_change included), as its
    float weights are not trained; a full run's network is left as it is."""
    if settings.model_type == "lora":
        network = adapter.trainable
        network.requires_grad_(False).to(compute_dtype)
        if settings.base_model_precision != "no_change":
            PRECISIONS[settings.base_model_precision].quantize(network, compute_dtype)
            logger.info("the frozen %s quantized to %s", type(network).__name__,
                        settings.base_model_precision)
    for number, encoder in enumerate(adapter.text_encoders, start=1):
        quantize_text_encoder(encoder, settings.text_encoder_precision(number), compute_dtype)


def quantize_text_encoder(encoder: torch.nn.Module, precision: str,
                          compute_dtype: torch.dtype) -> None:
    if precision != "no_change":
        PRECISIONS[precision].quantize(encoder, compute_dtype)
