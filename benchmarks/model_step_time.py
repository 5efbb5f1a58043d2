"""Median training-step time (forward, backward, AdamW) of a built-in tiny model on cached
latents: `python benchmarks/model_step_time.py [--model tiny-sd1x] [--batch 4] [--size 64]`.
DESIGN's target for tiny-sd1x, a 64x64 batch of 4 on two CPU cores: about 40-60 ms."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from simpletuner.models.base import LossSettings, TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-sd1x")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    family = args.model.removeprefix("tiny-")
    adapter = get_adapter_class(family).load(
        ensure_builtin_model(args.model), device=torch.device("cpu"),
        weight_dtype=torch.float32, loss_settings=LossSettings())
    pixels = torch.rand(args.batch, 3, args.size, args.size) * 2 - 1
    batch = TrainingBatch(
        latents=adapter.encode_images(pixels),
        prompt_embeds=adapter.encode_prompts(["a red circle"] * args.batch),
        original_sizes=[(args.size, args.size)] * args.batch,
        crop_top_lefts=[(0, 0)] * args.batch, target_sizes=[(args.size, args.size)] * args.batch)
    optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=1e-4)
    times = []
    for step in range(args.steps + 5):
        start = time.perf_counter()
        adapter.compute_loss(batch, torch.Generator().manual_seed(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= 5:  # the first steps pay for allocation and kernel selection
            times.append(time.perf_counter() - start)
    print(f"{args.model}: batch {args.batch} at {args.size}x{args.size}, "
          f"{torch.get_num_threads()} threads: median step "
          f"{statistics.median(times) * 1000:.1f} ms (min {min(times) * 1000:.1f} ms)")


if __name__ == "__main__":
    main()
