"""What each precision and optimizer keeps on the training device, for LoRA and full training.

    python benchmarks/bench_memory.py [--rank 16] [--json]

For each family's tiny model and for the real-size Flux transformer and SDXL UNet (built from
their published configs on the meta device, so nothing is downloaded or allocated), the bytes
while training (frozen base, trainable weights, gradients, optimizer state; no EMA) come from
the memory model `plan --memory` uses (simpletuner/training/memory/model.py), with mixed
precision bf16, and each row's total is set beside its mode's adamw/no_change row. Activations
are not counted: they depend on resolution, batch and gradient checkpointing. Once the caches
are complete the VAE and text encoders leave the device (frozen_components_after_caching), so
they are listed apart, as what caching needs.

tests/test_memory_plan.py checks that model against the tensors the trainer really creates.
"""

from __future__ import annotations

import argparse
import json

import torch
from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

from benchlib import parse_with_smoke
from simpletuner.configuration.options import TrainingConfig
from simpletuner.training.adapters.lora import add_lora
from simpletuner.training.memory.model import rank_bytes
from simpletuner.training.memory.shards import WHOLE
from simpletuner.training.memory.weight_bytes import frozen_bytes
from simpletuner.training.optimization.optimizers import OPTIMIZERS

GIB = 1024 ** 3
PRECISIONS = ("no_change", "int8-torchao", "int8-quanto", "int4-quanto", "fp8-torchao",
              "nf4-bnb")

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


TINY_FAMILIES = ("sd1x", "sd2x", "sdxl", "sd3", "flux")


def tiny_models(families) -> dict:
    """Each family's built-in tiny network, from the config builtin.py wrote (built on first
    use); its frozen parts are not listed (a few hundred kB)."""
    from simpletuner.models.builtin import ensure_builtin_model
    from simpletuner.models.registry import get_adapter_class
    models = {}
    for family in families:
        adapter_class = get_adapter_class(family)
        network_class = (getattr(adapter_class, "transformer_class", None)
                         or UNet2DConditionModel)
        config = network_class.load_config(ensure_builtin_model(f"tiny-{family}"),
                                           subfolder=adapter_class.trainable_component)
        models[f"tiny-{family}"] = (lambda c=config, k=network_class: k.from_config(c), [])
    return models


def settings(family: str, mode: str, precision: str, optimizer: str, rank: int
             ) -> TrainingConfig:
    return TrainingConfig(model_family=family, pretrained_model_name_or_path="unused",
                          output_dir="unused", data_backend_config="unused",
                          model_type=mode, lora_rank=rank, base_model_precision=precision,
                          optimizer=optimizer, mixed_precision="bf16")


def memory_row(network: torch.nn.Module, training: TrainingConfig) -> dict:
    """The memory model's bytes while training for ``network`` (on the meta device, a LoRA
    added when ``training`` trains one)."""
    held = rank_bytes(network, training, WHOLE, {})
    return {"mode": training.model_type, "precision": training.base_model_precision,
            "optimizer": training.optimizer, "frozen": sum(held.frozen.values()),
            "trainable": sum(held.trainable.values()), "gradients": held.gradients,
            "optimizer_state": held.optimizer, "total": held.while_training}


def model_rows(name: str, build, frozen_parts, adapter_class, rank: int) -> dict:
    family = adapter_class.family
    full = on_meta(build)
    rows = [memory_row(full, settings(family, "full", "no_change", optimizer, rank))
            for optimizer in OPTIMIZERS]
    lora = on_meta(build)
    add_lora(lora, adapter_class, rank=rank)
    rows += [memory_row(lora, settings(family, "lora", precision, optimizer, rank))
             for precision in PRECISIONS for optimizer in ("adamw", "adamw_bf16",
                                                          "ao-adamw8bit")]
    caching = sum(sum(frozen_bytes(on_meta(part).requires_grad_(False), "no_change",
                                   torch.bfloat16).values()) for part in frozen_parts)
    return {"model": name, "rank": rank, "rows": rows, "caching_only_bf16": caching}


def render(result: dict) -> str:
    lines = []
    for model in result["models"]:
        rows = model["rows"]
        unit, size = ("GiB", GIB) if rows[0]["total"] > GIB else ("MiB", 1024 ** 2)
        baseline = {row["mode"]: row["total"] for row in reversed(rows)
                    if row["optimizer"] == "adamw" and row["precision"] == "no_change"}
        caching = model["caching_only_bf16"]
        lines.append(f"\n{model['model']}: {unit} on the device while training"
                     + (f"; VAE and text encoders, caching only: {caching / size:.2f} {unit} "
                        "in bf16" if caching else ""))
        lines.append(f"{'mode':<9} {'precision':<13} {'optimizer':<14}" + "".join(
            f"{name:>8}" for name in ("frozen", "trained", "grads", "optim", "total"))
            + f"{'x adamw/no_change':>19}")
        for row in rows:
            mode = row["mode"] if row["mode"] == "full" else f"lora r{model['rank']}"
            parts = [row[k] / size for k in ("frozen", "trainable", "gradients",
                                             "optimizer_state", "total")]
            ratio = row["total"] / baseline[row["mode"]]
            lines.append(f"{mode:<9} {row['precision']:<13} {row['optimizer']:<14}"
                         + "".join(f"{x:>8.2f}" for x in parts) + f"{ratio:>19.2f}")
    return "\n".join(lines)


def main() -> None:
    from simpletuner.models.registry import get_adapter_class
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--families", nargs="+", default=list(TINY_FAMILIES),
                        choices=TINY_FAMILIES, help="the tiny models shown")
    args = parse_with_smoke(parser, families=["sd1x"])
    models = {**tiny_models(args.families), **real_size_models()}
    rows = [model_rows(name, build, parts, get_adapter_class(name.removeprefix("tiny-")),
                       args.rank) for name, (build, parts) in models.items()]
    result = {"rank": args.rank, "models": rows}
    print(json.dumps(result) if args.json else render(result))


if __name__ == "__main__":
    main()
