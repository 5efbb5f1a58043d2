"""Speed options side by side on tiny DiT families: eager against compiled
(``dynamo_backend``, regional compilation), gradient checkpointing of every block against every
2nd (``gradient_checkpointing_interval``), TREAD off and on (``tread_config``: half the image
tokens around the middle blocks); for each, the first step (compilation included), the
median step after it, and the loss after N steps (the same seeds for every setting: compiling
and the checkpoint interval train the same, TREAD its own way).

The tiny transformers are rebuilt with ``--layers`` blocks in each block list, so the
interval has blocks to skip. Full training, AdamW, one fixed batch.

    python benchmarks/bench_speed_options.py [family ...] [--steps N] [--device cuda]"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchlib import emit, format_table, machine, parse_with_smoke, ratio

from simpletuner.families import family_spec
from simpletuner.models.base import PLANNED_CAPTION, LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.training.compilation import compile_repeated_blocks

HEIGHT, WIDTH, BATCH = 64, 64, 2
# (name, compiled, gradient_checkpointing_interval (0: no checkpointing), TREAD)
SETTINGS = (("eager", False, 0, False), ("eager, ckpt 1", False, 1, False),
            ("eager, ckpt 2", False, 2, False), ("eager, TREAD 0.5", False, 0, True),
            ("compiled", True, 0, False), ("compiled, ckpt 1", True, 1, False))
# half the image tokens skip every block but the first and the last
TREAD = {"routes": [{"selection_ratio": 0.5, "start_layer_idx": 1, "end_layer_idx": -2}]}


def deep_adapter(family: str, layers: int, device: torch.device):
    adapter = get_adapter_class(family).load(
        ensure_builtin_model(f"tiny-{family}"), device=torch.device("cpu"),
        weight_dtype=torch.float32, loss_settings=LossSettings())
    network = adapter.transformer
    torch.manual_seed(0)
    adapter.transformer = type(network).from_config(
        {**network.config, **{key: layers for key in family_spec(family).swappable_block_keys}})
    adapter.move_to(device)
    return adapter


def fixed_batch(adapter, device: torch.device) -> TrainingBatch:
    pixels = torch.rand(BATCH, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return TrainingBatch(
            latents=adapter.encode_images(pixels.to(device) * 2 - 1),
            prompt_embeds=adapter.encode_prompts([PLANNED_CAPTION] * BATCH),
            original_sizes=[(HEIGHT, WIDTH)] * BATCH, crop_top_lefts=[(0, 0)] * BATCH,
            target_sizes=[(HEIGHT, WIDTH)] * BATCH)


def measure(family: str, compiled: bool, interval: int, tread: bool, args,
            device: torch.device) -> dict:
    adapter = deep_adapter(family, args.layers, device)
    adapter.set_gradient_checkpointing(interval > 0, max(interval, 1))
    if tread:
        adapter.route_tokens(TREAD)
    if compiled:
        compile_repeated_blocks(adapter, args.backend)
    batch = fixed_batch(adapter, device)
    optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=1e-4)
    times, loss = [], None
    for step in range(args.steps):
        started = time.perf_counter()
        loss = adapter.compute_loss(batch, torch.Generator(device).manual_seed(100 + step))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return {"first_s": times[0], "step_ms": 1000 * statistics.median(times[1:] or times),
            "loss": loss.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=["flux", "wan"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--layers", type=int, default=4, help="blocks in each block list")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="the eager rows only")
    parser.add_argument("--json", action="store_true")
    # smoke: compiling a block takes minutes on a loaded CPU; tests/test_compile_training.py
    # trains compiled
    args = parse_with_smoke(parser, families=["flux"], steps=2, layers=2, compile=False)
    device = torch.device(args.device)
    rows = []
    for family in args.families:
        eager_ms = None
        for name, compiled, interval, tread in SETTINGS:
            if compiled and not args.compile:
                continue
            row = {"family": family, "setting": name,
                   **measure(family, compiled, interval, tread, args, device)}
            eager_ms = eager_ms or row["step_ms"]
            row["x_eager"] = ratio(eager_ms, row["step_ms"])
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
    table = format_table(
        ("family", "setting", "first step s", "ms/step", "x eager", f"loss after {args.steps}"),
        [(r["family"], r["setting"], r["first_s"], r["step_ms"], r["x_eager"],
          f"{r['loss']:.5f}") for r in rows])
    emit({"rows": rows, "steps": args.steps, "layers": args.layers, "device": args.device,
          "backend": args.backend, "machine": machine()}, args.json, table)


if __name__ == "__main__":
    main()
