"""What each precision and optimizer keeps on the training device, for LoRA and full training.

    python benchmarks/bench_memory.py [--rank 16] [--json]

For each family's tiny model and for the real-size Flux transformer and SDXL UNet (built from
their published configs on the meta device, so nothing is downloaded or allocated), the bytes of
device-resident weights (frozen base + trainable), gradients and optimizer state are computed
from parameter shapes with each library's storage layout (``weight_bytes``,
``optimizer_state_bytes``). Activations are not counted: they depend on resolution, batch and
gradient checkpointing. Once the caches are complete the VAE and text encoders leave the
device (frozen_components_after_caching), so they are listed apart, as what caching needs.

tests/test_bench_memory.py checks, on the tiny models that really run on this CPU, that the
computed bytes equal the bytes of the tensors the trainer really creates.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from simpletuner.training.optimization.optimizers import OPTIMIZERS

GIB = 1024 ** 3
PRECISIONS = ("no_change", "int8-torchao", "int8-quanto", "int4-quanto", "fp8-torchao",
              "nf4-bnb")
QUANTO_GROUP = 128      # optimum-quanto's largest int4 group size along the input features
AO_8BIT_BLOCK = 256     # torchao / bitsandbytes 8-bit optimizer block size
MIN_8BIT_NUMEL = 4096   # smaller tensors keep float32 states in both libraries

FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
SDXL_BASE = dict(sample_size=128, cross_attention_dim=2048, addition_embed_type="text_time",
                 addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
                 block_out_channels=(320, 640, 1280), attention_head_dim=(5, 10, 20),
                 transformer_layers_per_block=(1, 2, 10), use_linear_projection=True,
                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                                   "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"))
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
              num_hidden_layers=12, projection_dim=768)
CLIP_BIG_G = dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=20,
                  num_hidden_layers=32, projection_dim=1280, hidden_act="gelu")
T5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu", vocab_size=32128)
SDXL_VAE = dict(block_out_channels=(128, 256, 512, 512), latent_channels=4, layers_per_block=2,
                down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4)


def quantized_weight_bytes(precision: str, weight: torch.Tensor, float_bytes: int) -> int:
    """Bytes of one frozen Linear (or, for quanto, Conv2d) weight as the library stores it."""
    out, numel = weight.shape[0], weight.numel()
    if precision == "int8-torchao":   # int8 data, float32 scale and int8 zero point per row
        return numel + out * 4 + out
    if precision == "int8-quanto":    # int8 data, a scale per output row in the float dtype
        return numel + out * float_bytes
    if precision == "int4-quanto":    # two per byte; scale and shift per group of inputs
        group = quanto_group_size(numel // out)
        groups = numel // group if group else out
        return numel // 2 + 2 * groups * float_bytes
    if precision == "fp8-torchao":    # float8 data, float32 scale per row
        return numel + out * 4
    if precision == "nf4-bnb":        # two per byte; int8 absmax per 64, float32 per 256 of those
        return numel // 2 + numel // 64 + math.ceil(numel / 64 / 256) * 4
    raise ValueError(precision)


def quanto_group_size(inputs: int) -> int | None:
    """optimum-quanto's int4 group size for rows of ``inputs`` values (QModuleMixin): 128, or
    less by steps of 32 down to 32 until it divides the row; None (one group per row) when the
    row is no longer than 128 or nothing divides it."""
    if inputs <= QUANTO_GROUP:
        return None
    group = QUANTO_GROUP
    while inputs % group and group > 32:
        group -= 32
    return group if inputs % group == 0 else None


def _quantized_here(precision: str, module: torch.nn.Module) -> bool:
    kinds = (torch.nn.Linear, torch.nn.Conv2d) if precision.endswith("quanto") else (
        torch.nn.Linear,)
    return (precision != "no_change" and isinstance(module, kinds)
            and not module.weight.requires_grad)


def weight_bytes(network: torch.nn.Module, precision: str, float_dtype: torch.dtype) -> dict:
    """{"frozen", "trainable"} bytes of ``network``'s parameters and buffers, frozen float
    weights in ``float_dtype`` and quantized as ``precision`` where the library does it."""
    float_bytes = torch.empty((), dtype=float_dtype).element_size()
    quantized = {id(m.weight): m.weight for m in network.modules() if _quantized_here(precision, m)}
    frozen = trainable = 0
    for parameter in network.parameters():
        if parameter.requires_grad:
            trainable += parameter.numel() * parameter.element_size()
        elif id(parameter) in quantized:
            frozen += quantized_weight_bytes(precision, parameter, float_bytes)
        else:
            frozen += parameter.numel() * float_bytes
    if precision.endswith("quanto"):  # each quantized module's input and output scale buffers
        frozen += len(quantized) * 2 * float_bytes
    frozen += sum(b.numel() * b.element_size() for b in network.buffers())
    return {"frozen": frozen, "trainable": trainable}


def optimizer_state_bytes(optimizer: str, parameters: list[torch.Tensor]) -> int:
    """Bytes of the state ``optimizer`` keeps for these trainable parameters (their dtype is
    the one build_optimizer gives them)."""
    # One 4-byte tensor per param group: optimi's int32 step, torchao's float32 learning rate.
    total = 4 if optimizer in ("adamw_bf16", "ao-adamw8bit") else 0
    for p in parameters:
        n, size = p.numel(), p.element_size()
        if optimizer == "adamw":
            total += 2 * n * size + 4                          # two moments, float32 step
        elif optimizer == "adamw_bf16":
            total += 3 * n * size                              # two moments, Kahan compensation
        elif optimizer in ("ao-adamw8bit", "bnb-adamw8bit"):
            eight_bit = n >= MIN_8BIT_NUMEL and n % AO_8BIT_BLOCK == 0
            moment = n + n // AO_8BIT_BLOCK * 4 + (256 * 4 if optimizer == "ao-adamw8bit" else 0)
            total += 2 * (moment if eight_bit else n * 4) + 4
        elif optimizer == "prodigy":
            # moments, s, p0; p0 of an all-zero parameter (a zero-initialised bias) is a
            # single number, which shapes cannot tell: an upper bound for those
            total += 4 * n * size
        elif optimizer == "adafactor":
            factored = p.numel() // p.shape[-2] + p.numel() // p.shape[-1] if p.dim() > 1 else n
            total += factored * size + 4
        elif optimizer == "lion":
            total += n * size
        else:
            raise ValueError(optimizer)
    return total


def trainable_dtype(optimizer: str) -> torch.dtype:
    return torch.bfloat16 if OPTIMIZERS[optimizer].bf16_weights else torch.float32


def memory_row(network: torch.nn.Module, precision: str, optimizer: str,
               float_dtype: torch.dtype) -> dict:
    """Bytes of one choice for ``network`` whose trainable parameters (a LoRA, or all of it)
    require grad; those are counted in the dtype build_optimizer gives them."""
    dtype = trainable_dtype(optimizer)
    trainable = [torch.empty(p.shape, dtype=dtype, device="meta")
                 for p in network.parameters() if p.requires_grad]
    weights = weight_bytes(network, precision, float_dtype)
    weights["trainable"] = sum(p.numel() * p.element_size() for p in trainable)
    return {"precision": precision, "optimizer": optimizer, **weights,
            "gradients": weights["trainable"],
            "optimizer_state": optimizer_state_bytes(optimizer, trainable)}


def on_meta(build):
    with torch.device("meta"):
        return build()


def real_size_models() -> dict:
    """Flux.1-dev's transformer and SDXL's UNet, with the frozen parts each needs to cache."""
    return {"flux": (lambda: FluxTransformer2DModel(**FLUX_DEV),
                     [lambda: CLIPTextModel(CLIPTextConfig(**CLIP_L)),
                      lambda: T5EncoderModel(T5Config(**T5_XXL)),
                      lambda: AutoencoderKL(**dict(SDXL_VAE, latent_channels=16))]),
            "sdxl": (lambda: UNet2DConditionModel(**SDXL_BASE),
                     [lambda: CLIPTextModel(CLIPTextConfig(**CLIP_L)),
                      lambda: CLIPTextModel(CLIPTextConfig(**CLIP_BIG_G)),
                      lambda: AutoencoderKL(**SDXL_VAE)])}


def tiny_models() -> dict:
    """Each family's built-in tiny network, from the config builtin.py wrote (built on first
    use); its frozen parts are not listed (a few hundred kB)."""
    from simpletuner.models.builtin import ensure_builtin_model
    from simpletuner.models.registry import get_adapter_class
    models = {}
    for family in ("sd1x", "sd2x", "sdxl", "sd3", "flux"):
        adapter_class = get_adapter_class(family)
        network_class = (getattr(adapter_class, "transformer_class", None)
                         or UNet2DConditionModel)
        config = network_class.load_config(ensure_builtin_model(f"tiny-{family}"),
                                           subfolder=adapter_class.trainable_component)
        models[f"tiny-{family}"] = (lambda c=config, k=network_class: k.from_config(c), [])
    return models


def model_rows(name: str, build, frozen_parts, adapter_class, rank: int) -> dict:
    from simpletuner.training.lora import add_lora
    full = on_meta(build).to(torch.bfloat16)
    rows = [dict(memory_row(full, "no_change", name, torch.bfloat16), mode="full")
            for name in OPTIMIZERS]
    lora = on_meta(build).to(torch.bfloat16)
    add_lora(lora, adapter_class, rank=rank)
    rows += [dict(memory_row(lora, precision, name, torch.bfloat16), mode=f"lora r{rank}")
             for precision in PRECISIONS for name in ("adamw", "adamw_bf16", "ao-adamw8bit")]
    caching = sum(p.numel() * 2 for part in frozen_parts for p in on_meta(part).parameters())
    return {"model": name, "rows": rows, "caching_only_bf16": caching}


def render(result: dict) -> str:
    lines = []
    for model in result["models"]:
        unit, size = ("GiB", GIB) if model["rows"][0]["frozen"] + model["rows"][0][
            "trainable"] > GIB else ("MiB", 1024 ** 2)
        caching = model["caching_only_bf16"]
        lines.append(f"\n{model['model']}: {unit} on the device (weights + gradients + "
                     "optimizer state)" + (f"; VAE and text encoders, caching only: "
                                           f"{caching / size:.2f} {unit} in bf16" if caching
                                           else ""))
        lines.append(f"{'mode':<9} {'precision':<13} {'optimizer':<14} {'frozen':>7} "
                     f"{'trained':>8} {'grads':>7} {'optim':>7} {'total':>7}")
        for row in model["rows"]:
            parts = [row[k] / size for k in ("frozen", "trainable", "gradients",
                                             "optimizer_state")]
            lines.append(f"{row['mode']:<9} {row['precision']:<13} {row['optimizer']:<14} "
                         + " ".join(f"{x:>7.2f}" for x in parts) + f" {sum(parts):>7.2f}")
    return "\n".join(lines)


def main() -> None:
    from simpletuner.models.registry import get_adapter_class
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    models = {**tiny_models(), **real_size_models()}
    rows = [model_rows(name, build, parts, get_adapter_class(name.removeprefix("tiny-")),
                       args.rank) for name, (build, parts) in models.items()]
    result = {"rank": args.rank, "models": rows}
    print(json.dumps(result) if args.json else render(result))


if __name__ == "__main__":
    main()
