"""Trainer overhead: the project's training loop against a bare hand-written loop.

    python benchmarks/bench_train.py [--steps 60] [--rounds 2] [--batch-size 4] [--json]

Both sides train builtin:tiny-sd1x on the demo dataset (108 captioned shapes, three aspect
buckets at 64 px) from cached latents and text embeddings, with AdamW, gradient clipping and
a constant learning rate, in this one process and on the same threads:

* trainer: simpletuner.training.recipe.run_training on a config with those settings. Its steps
  are timed at the two calls every step makes into the Accelerator (a subclass here, the
  recipe is unchanged): ``autocast()`` when the micro-batch is ready, ``log()`` when the
  optimizer step is done. Data waiting is the time from one step's end to the next
  micro-batch being ready (sampler, batch assembly from the caches, the loop itself).
* bare: the same micro-batches in the same order, assembled into memory beforehand, and a
  plain loop of compute_loss, backward, clip, step, zero_grad on a freshly loaded model.

The sides alternate for --rounds rounds; the first --warmup steps of each run are not counted,
and each side's best round counts (other programs on the machine only ever add time).

--model-only times the bare loop alone at other batch sizes or resolutions (what
DESIGN.md quotes: a 64x64 batch of 4 trains in about 40-60 ms on two cores). --assembly-only
times batch assembly alone from real cache files, also at SDXL size (1024 px latents, 2048-wide
embeddings), with and without the text-embedding LRU: the data side of large models.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator

from benchlib import data_folder, emit, format_table, machine, ratio, verdict
from simpletuner.configuration import load_configuration
from simpletuner.demo_data import ensure_demo_dataset
from simpletuner.helpers.caching.latents import LatentCache
from simpletuner.helpers.caching.prepare import prepare_caches
from simpletuner.helpers.caching.storage import entry_path, save_entry
from simpletuner.helpers.caching.text_embeds import TextEmbedCache
from simpletuner.helpers.metadata.startup import build_sampler, start_data
from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
from simpletuner.helpers.multiaspect.dataset import BatchAssembler
from simpletuner.models.base import LossSettings, TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.recipe import run_training

MODEL = "tiny-sd1x"


class TimedAccelerator(Accelerator):
    """Records when each micro-batch reaches the model and when each optimizer step ends."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ready: list[float] = []
        self.done: list[float] = []

    def autocast(self, *args, **kwargs):
        self.ready.append(time.perf_counter())
        return super().autocast(*args, **kwargs)

    def log(self, values, step=None, log_kwargs=None):
        self.done.append(time.perf_counter())
        return super().log(values, step=step, log_kwargs=log_kwargs or {})


def write_config(folder: Path, args) -> Path:
    dataset = {"id": "demo-shapes", "instance_data_dir": str(ensure_demo_dataset(
        data_folder("demo-shapes"))), "caption_strategy": "textfile"}
    (folder / "multidatabackend.json").write_text(json.dumps([dataset]))
    config = {
        "model_family": "sd1x", "pretrained_model_name_or_path": f"builtin:{MODEL}",
        "output_dir": str(folder / "output"),
        "data_backend_config": str(folder / "multidatabackend.json"),
        "seed": 42, "resolution": 64, "aspect_bucket_alignment": 16,
        "train_batch_size": args.batch_size, "max_train_steps": args.steps,
        "learning_rate": 3e-4, "lr_scheduler": "constant", "max_grad_norm": 1.0,
        "report_to": "none",
    }
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def trainer_run(config_path: Path, accelerator: TimedAccelerator) -> dict:
    accelerator.ready.clear()
    accelerator.done.clear()
    run_training(load_configuration(config_path), accelerator)
    done, ready = accelerator.done, accelerator.ready
    # Step i (i >= 1) runs from done[i-1] to done[i]; its data wait ends at ready[i].
    steps = [b - a for a, b in zip(done, done[1:])]
    waits = [r - d for d, r in zip(done, ready[1:])]
    return {"steps": steps, "waits": waits}


def bare_batches(config_path: Path, accelerator: Accelerator, count: int):
    """The micro-batches the trainer trained on, in its order, assembled into memory."""
    configuration = load_configuration(config_path)
    training = configuration.training
    startup = start_data(configuration, accelerator)
    adapter = load_adapter(training)
    caches = prepare_caches(
        configuration.datasets, startup.indexes,
        {i: b.caption_for for i, b in startup.backends.items()}, adapter.encode_images,
        adapter.encode_prompts, model_folder=ensure_builtin_model(MODEL), family="sd1x",
        output_dir=training.output_dir, seed=startup.seed, rank=0, world_size=1,
        progress=False)
    sampler = build_sampler(startup, training, accelerator, indexes=caches.indexes)
    batches: list[TrainingBatch] = []
    while len(batches) < count:
        batches.extend(caches.assembler(mb) for mb in sampler)
    return batches[:count]


def load_adapter(training):
    return get_adapter_class("sd1x").load(
        ensure_builtin_model(MODEL), device=torch.device("cpu"), weight_dtype=torch.float32,
        loss_settings=LossSettings.from_config(training))


def bare_run(batches: list[TrainingBatch], training) -> dict:
    adapter = load_adapter(training)
    network = adapter.trainable
    network.train()
    optimizer = torch.optim.AdamW(
        [p for p in network.parameters() if p.requires_grad], lr=training.learning_rate,
        betas=(training.adam_beta1, training.adam_beta2),
        weight_decay=training.adam_weight_decay, eps=training.adam_epsilon)
    steps = []
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - start)
    return {"steps": steps[1:]}  # like the trainer's: the first step has no start mark


def summary(run: dict, warmup: int) -> dict:
    steps = run["steps"][warmup:]
    out = {"step_ms": round(statistics.fmean(steps) * 1e3, 2),
           "median_step_ms": round(statistics.median(steps) * 1e3, 2), "steps": len(steps)}
    if "waits" in run:
        waits = run["waits"][warmup:]
        out["data_wait_ms"] = round(statistics.fmean(waits) * 1e3, 3)
        out["max_data_wait_ms"] = round(max(waits) * 1e3, 2)
    return out


def measure(args) -> dict:
    accelerator = TimedAccelerator(cpu=not torch.cuda.is_available(), mixed_precision="no")
    trainer_rounds, bare_rounds = [], []
    with tempfile.TemporaryDirectory() as tmp:
        config_path = write_config(Path(tmp), args)
        training = load_configuration(config_path).training
        print("first trainer run (builds the caches, not counted)...", file=sys.stderr)
        trainer_run(config_path, accelerator)
        batches = bare_batches(config_path, accelerator, args.steps)
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds}: trainer, then bare loop...", file=sys.stderr)
            trainer_rounds.append(summary(trainer_run(config_path, accelerator), args.warmup))
            bare_rounds.append(summary(bare_run(batches, training), args.warmup))
    accelerator.end_training()
    trainer = min(trainer_rounds, key=lambda r: r["step_ms"])
    bare = min(bare_rounds, key=lambda r: r["step_ms"])
    result = {
        "model": MODEL, "batch_size": args.batch_size, "resolution": 64,
        "steps_per_run": args.steps, "warmup_steps": args.warmup, "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "trainer_step_ms": trainer["step_ms"], "bare_loop_step_ms": bare["step_ms"],
        "trainer_median_step_ms": trainer["median_step_ms"],
        "bare_loop_median_step_ms": bare["median_step_ms"],
        "trainer_over_bare": ratio(trainer["step_ms"], bare["step_ms"]),
        "data_wait_ms": trainer["data_wait_ms"], "max_data_wait_ms": trainer["max_data_wait_ms"],
        "data_wait_share": round(trainer["data_wait_ms"] / trainer["step_ms"], 4),
        "all_rounds": {"trainer": trainer_rounds, "bare": bare_rounds},
    }
    result["targets"] = {
        "trainer step within 5% of the bare loop": result["trainer_over_bare"] <= 1.05,
        "data waiting under 5% of step time": result["data_wait_share"] < 0.05,
    }
    return result


def render(result: dict) -> str:
    m = result["machine"]
    rows = [["bare loop (same batches, in memory)", result["bare_loop_step_ms"],
             result["bare_loop_median_step_ms"], None, 1.0],
            ["project trainer (run_training)", result["trainer_step_ms"],
             result["trainer_median_step_ms"], result["data_wait_ms"],
             result["trainer_over_bare"]]]
    lines = [
        f"Training steps: {result['model']}, batch {result['batch_size']} at 64 px, cached "
        f"latents, {result['steps_per_run']} steps per run (first {result['warmup_steps']} not "
        f"counted), best of {result['rounds']} rounds; {m['cpus']} CPUs, "
        f"{result['torch_threads']} torch threads, load {m['load_average_1_5_15']}",
        format_table(["", "mean step ms", "median ms", "data wait ms", "x bare"], rows),
        f"data waiting: {result['data_wait_share']:.1%} of the trainer's step time "
        f"(longest wait {result['max_data_wait_ms']} ms)",
    ]
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def model_only(args) -> None:
    """The bare step alone on synthetic latents: the model's own speed on this machine."""
    adapter = get_adapter_class("sd1x").load(
        ensure_builtin_model(MODEL), device=torch.device("cpu"), weight_dtype=torch.float32,
        loss_settings=LossSettings())
    pixels = torch.rand(args.batch_size, 3, args.size, args.size) * 2 - 1
    size = (args.size, args.size)
    batch = TrainingBatch(latents=adapter.encode_images(pixels),
                          prompt_embeds=adapter.encode_prompts(["a red circle"] * args.batch_size),
                          original_sizes=[size] * args.batch_size,
                          crop_top_lefts=[(0, 0)] * args.batch_size,
                          target_sizes=[size] * args.batch_size)
    optimizer = torch.optim.AdamW(adapter.trainable.parameters(), lr=1e-4)
    times = []
    for step in range(args.steps + args.warmup):
        start = time.perf_counter()
        adapter.compute_loss(batch, torch.Generator().manual_seed(step)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    result = {"machine": machine(), "model": MODEL, "batch_size": args.batch_size,
              "resolution": args.size, "torch_threads": torch.get_num_threads(),
              "median_step_ms": round(statistics.median(times) * 1e3, 2),
              "min_step_ms": round(min(times) * 1e3, 2)}
    emit(result, args.json, f"{MODEL}: batch {args.batch_size} at {args.size}x{args.size}, "
         f"{result['torch_threads']} threads: median step {result['median_step_ms']} ms "
         f"(min {result['min_step_ms']} ms)")


# name: (latent shape, {embedding name: shape}); captions repeat (8 distinct over 64 samples)
ASSEMBLY_CASES = {
    "tiny-sd1x 64px": ((4, 8, 8), {"prompt_embeds": (77, 32)}),
    "sdxl 1024px": ((4, 128, 128), {"prompt_embeds": (77, 2048),
                                    "pooled_prompt_embeds": (1280,)}),
}


def assembly_only(args) -> None:
    """BatchAssembler alone, from cache files written here; the page cache is warm, as in a
    running epoch."""
    samples, rows, result = 64, [], {"machine": machine(), "batch_size": args.batch_size,
                                     "cases": {}}
    for name, (latent_shape, embed_shapes) in ASSEMBLY_CASES.items():
        for keep in (0, 64):
            with tempfile.TemporaryDirectory() as tmp:
                latents = LatentCache(Path(tmp) / "vae")
                text = TextEmbedCache(Path(tmp) / "text", "te", keep_in_memory=keep)
                for i in range(samples):
                    path = entry_path(latents.folder, f"{i:064x}")
                    save_entry(path, {"latent": torch.randn(latent_shape),
                                      "geometry": torch.tensor([64, 64, 0, 0, 64, 64])})
                    latents.paths[f"{i}.png"] = path
                for c in range(8):
                    save_entry(text.path_for(f"caption {c}"),
                               {k: torch.randn(shape) for k, shape in embed_shapes.items()})
                assembler = BatchAssembler({"d": latents}, {"d": text})
                b = args.batch_size
                batches = [MicroBatch(0, s, "d", "64x64", tuple(
                    BatchSample("d", f"{(s * b + k) % samples}.png", "64x64", (64, 64),
                                f"caption {(s + k) % 8}") for k in range(b)))
                    for s in range(200)]
                assembler(batches[0])
                start = time.perf_counter()
                for micro_batch in batches:
                    assembler(micro_batch)
                ms = (time.perf_counter() - start) / len(batches) * 1e3
            result["cases"][f"{name}, text LRU {keep}"] = round(ms, 3)
            rows.append([name, keep, ms])
    emit(result, args.json, f"Batch assembly from cache files, batch {args.batch_size}\n"
         + format_table(["", "text LRU rows", "ms per micro-batch"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps not counted per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--model-only", action="store_true",
                        help="time the bare step on synthetic latents only")
    parser.add_argument("--size", type=int, default=64, help="image side for --model-only")
    parser.add_argument("--assembly-only", action="store_true",
                        help="time batch assembly from cache files only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.model_only:
        model_only(args)
        return
    if args.assembly_only:
        assembly_only(args)
        return
    result = {"machine": machine(), **measure(args)}
    result["machine_after"] = machine()["load_average_1_5_15"]
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
