"""Trainer overhead: the project's training loop against a bare hand-written loop.

    python benchmarks/bench_train.py [--steps 60] [--rounds 3] [--batch-size 4] [--json]
    python benchmarks/bench_train.py --device cuda       # on a machine with a GPU

Both sides train builtin:tiny-sd1x on the demo dataset (108 captioned shapes, three aspect
buckets at 64 px) from cached latents and text embeddings, with AdamW, gradient clipping and
a constant learning rate, in this one process and on the same threads:

* trainer: simpletuner.training.recipe.Trainer on a config with those settings. Its steps
  are timed at the two calls every step makes into the Accelerator (a subclass here, the
  recipe is unchanged): ``autocast()`` when the micro-batch is ready, ``log()`` when the
  optimizer step is done. Data waiting is the time from one step's end to the next
  micro-batch being ready (sampler, batch assembly from the caches, the loop itself).
* bare: the same micro-batches in the same order, assembled into memory (on the device)
  beforehand, and a plain loop of compute_loss, backward, clip, step, zero_grad on a freshly
  loaded model.

Two cases, each with both sides: the tiny model's own batches, and "SDXL-sized assembly": the
same training, but each micro-batch is assembled only after an SDXL-sized batch (1024 px
latents, 2048-wide embeddings, with the text LRU) has been read for the same samples from other
cache files, so assembling takes about as long as the tiny model's step and any of it that is
not hidden behind the step shows as data waiting. The bare loop never assembles, so it is the
same in both cases.

The sides alternate for --rounds rounds; the first --warmup steps of each run are not counted,
and each side's best round counts (other programs on the machine only ever add time). With
--device cuda one more run of each side per case runs under torch.profiler, for the share of
wall time in which the GPU ran nothing (device_idle.py).

--model-only times the bare loop alone at other batch sizes or resolutions (the figures are in
benchmarks/PERFORMANCE.md). --assembly-only
times batch assembly alone from real cache files, also at SDXL size, with and without the
text-embedding LRU: the data side of large models.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import replace
from pathlib import Path

import torch
from accelerate import Accelerator

from benchlib import data_folder, emit, format_table, machine, parse_with_smoke, ratio, verdict
from device_idle import mark_step, profiled
from simpletuner.configuration import load_configuration
from simpletuner.demo_data import ensure_demo_dataset
from simpletuner.helpers.caching.latents import LatentCache
from simpletuner.helpers.caching.prepare import prepare_caches
from simpletuner.helpers.caching.storage import entry_path, save_entry
from simpletuner.helpers.caching.text_embeds import TextEmbedCache
from simpletuner.helpers.metadata.startup import build_sampler, start_data
from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
from simpletuner.helpers.multiaspect.dataset import BatchAssembler
from simpletuner.models.base import LossSettings
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.models.transfer import batch_to_device
from simpletuner.training.recipe import Trainer

MODEL = "tiny-sd1x"
CACHED_SAMPLES, CACHED_CAPTIONS = 64, 8  # of the extra cache files an assembly case reads

# name: (latent shape, {embedding name: shape})
ASSEMBLY_CASES = {
    "tiny-sd1x 64px": ((4, 8, 8), {"prompt_embeds": (77, 32)}),
    "sdxl 1024px": ((4, 128, 128), {"prompt_embeds": (77, 2048),
                                    "pooled_prompt_embeds": (1280,)}),
}
TRAINING_CASES = {"tiny batch": None, "SDXL-sized assembly": "sdxl 1024px"}


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
        mark_step()
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


def cache_assembler(folder: Path, latent_shape, embed_shapes, keep_in_memory: int):
    """A BatchAssembler over generated cache files: samples "<i>.png", captions "caption <c>"."""
    latents = LatentCache(folder / "vae")
    text = TextEmbedCache(folder / "text", "te", keep_in_memory=keep_in_memory)
    for i in range(CACHED_SAMPLES):
        path = entry_path(latents.folder, f"{i:064x}")
        save_entry(path, {"latent": torch.randn(latent_shape),
                          "geometry": torch.tensor([64, 64, 0, 0, 64, 64])})
        latents.paths[f"{i}.png"] = path
    for c in range(CACHED_CAPTIONS):
        save_entry(text.path_for(f"caption {c}"),
                   {k: torch.randn(shape) for k, shape in embed_shapes.items()})
    return BatchAssembler({"d": latents}, {"d": text})


class HeavierAssembler:
    """The real batch, assembled after reading a larger batch for the same samples from the
    generated cache files (and dropping it): the trainer pays a large model's data cost."""

    def __init__(self, real: BatchAssembler, larger: BatchAssembler):
        self.real, self.larger = real, larger

    def __call__(self, micro_batch: MicroBatch) -> TrainingBatch:
        self.larger(MicroBatch(micro_batch.epoch, micro_batch.step, "d", micro_batch.bucket,
                               tuple(self._stand_in(s) for s in micro_batch.samples)))
        return self.real(micro_batch)

    @staticmethod
    def _stand_in(sample: BatchSample) -> BatchSample:
        n = zlib.crc32(sample.sample_id.encode())
        return replace(sample, dataset_id="d", sample_id=f"{n % CACHED_SAMPLES}.png",
                       caption=f"caption {n % CACHED_CAPTIONS}")


class TrainerAssemblingLike(Trainer):
    """The real trainer whose caches assemble like an ASSEMBLY_CASES entry: each micro-batch
    also assembles a stand-in batch of that case's sizes (``larger``), then the real one."""

    def __init__(self, configuration, accelerator, larger: BatchAssembler | None):
        super().__init__(configuration, accelerator)
        self.larger = larger

    def _prepare_caches(self):
        caches = super()._prepare_caches()
        if self.larger is None:
            return caches
        return replace(caches, assembler=HeavierAssembler(caches.assembler, self.larger))


def trainer_run(config_path: Path, accelerator: TimedAccelerator,
                larger: BatchAssembler | None = None) -> dict:
    accelerator.ready.clear()
    accelerator.done.clear()
    configuration = load_configuration(config_path)
    # Every run starts fresh over the first run's caches: its last step is a checkpoint.
    for checkpoint in Path(configuration.training.output_dir).glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    TrainerAssemblingLike(configuration, accelerator, larger).run()
    done, ready = accelerator.done, accelerator.ready
    # Step i (i >= 1) runs from done[i-1] to done[i]; its data wait ends at ready[i].
    steps = [b - a for a, b in zip(done, done[1:])]
    waits = [r - d for d, r in zip(done, ready[1:])]
    return {"steps": steps, "waits": waits}


def bare_batches(config_path: Path, accelerator: Accelerator, count: int):
    """The micro-batches the trainer trained on, in its order, assembled into device memory."""
    configuration = load_configuration(config_path)
    training = configuration.training
    startup = start_data(configuration, accelerator, seed=configuration.training.seed)
    adapter = load_adapter(training, torch.device("cpu"))
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
    return [batch_to_device(b, accelerator.device) for b in batches[:count]]


def load_adapter(training, device: torch.device):
    return get_adapter_class("sd1x").load(
        ensure_builtin_model(MODEL), device=device, weight_dtype=torch.float32,
        loss_settings=LossSettings.from_config(training))


def bare_run(batches: list[TrainingBatch], training, device: torch.device) -> dict:
    adapter = load_adapter(training, device)
    network = adapter.trainable
    network.train()
    optimizer = torch.optim.AdamW(
        [p for p in network.parameters() if p.requires_grad], lr=training.learning_rate,
        betas=(training.adam_beta1, training.adam_beta2),
        weight_decay=training.adam_weight_decay, eps=training.adam_epsilon)
    done = [time.perf_counter()]
    for step, batch in enumerate(batches):
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done.append(time.perf_counter())
        mark_step()
    # Like the trainer's: from one step's end to the next (the first step has no start mark).
    return {"steps": [b - a for a, b in zip(done[1:], done[2:])]}


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
    device = torch.device(args.device)
    accelerator = TimedAccelerator(cpu=device.type == "cpu", mixed_precision="no")
    rounds = {case: {"trainer": [], "bare": []} for case in TRAINING_CASES}
    idle = {}
    with tempfile.TemporaryDirectory() as tmp:
        config_path = write_config(Path(tmp), args)
        training = load_configuration(config_path).training
        print("first trainer run (builds the caches, not counted)...", file=sys.stderr)
        trainer_run(config_path, accelerator)
        batches = bare_batches(config_path, accelerator, args.steps)
        sides = {
            "trainer": lambda case: trainer_in_case(case, config_path, accelerator, Path(tmp)),
            "bare": lambda case: bare_run(batches, training, accelerator.device)}
        for round_ in range(args.rounds):
            for case in TRAINING_CASES:
                print(f"round {round_ + 1}/{args.rounds}, {case}: trainer, then bare loop...",
                      file=sys.stderr)
                for side, run in sides.items():
                    rounds[case][side].append(summary(run(case), args.warmup))
        if device.type == "cuda":
            print("one profiled run of each side per case...", file=sys.stderr)
            idle = {case: {side: profiled(lambda: run(case), args.warmup)[1]
                           for side, run in sides.items()} for case in TRAINING_CASES}
    accelerator.end_training()
    cases = {case: case_result(rounds[case], idle.get(case)) for case in TRAINING_CASES}
    result = {
        "model": MODEL, "device": str(accelerator.device), "batch_size": args.batch_size,
        "resolution": 64, "steps_per_run": args.steps, "warmup_steps": args.warmup,
        "rounds": args.rounds, "torch_threads": torch.get_num_threads(), "cases": cases,
    }
    result["targets"] = {
        "tiny batch: trainer step within 2% of the bare loop":
            cases["tiny batch"]["trainer_over_bare"] <= 1.02,
        **{f"{case}: data waiting under 0.5% of step time": c["data_wait_share"] < 0.005
           for case, c in cases.items()},
    }
    return result


def trainer_in_case(case: str, config_path: Path, accelerator, folder: Path) -> dict:
    shapes = TRAINING_CASES[case]
    larger = None
    if shapes is not None:
        latent_shape, embed_shapes = ASSEMBLY_CASES[shapes]
        larger = cache_assembler(folder / "larger-cache", latent_shape, embed_shapes,
                                 keep_in_memory=64)
    return trainer_run(config_path, accelerator, larger)


def case_result(rounds: dict, idle: dict | None) -> dict:
    trainer = min(rounds["trainer"], key=lambda r: r["step_ms"])
    bare = min(rounds["bare"], key=lambda r: r["step_ms"])
    return {"trainer": trainer, "bare": bare,
            "trainer_over_bare": ratio(trainer["step_ms"], bare["step_ms"]),
            "data_wait_share": round(trainer["data_wait_ms"] / trainer["step_ms"], 4),
            "device_idle_share": idle, "all_rounds": rounds}


def render(result: dict) -> str:
    m, rows = result["machine"], []
    with_idle = result["device"].startswith("cuda")
    for case, c in result["cases"].items():
        trainer, bare, idle = c["trainer"], c["bare"], c["device_idle_share"] or {}
        rows.append([f"{case}: bare loop (batches in memory)", bare["step_ms"],
                     bare["median_step_ms"], None, None, 1.0]
                    + ([idle.get("bare")] if with_idle else []))
        rows.append([f"{case}: project trainer", trainer["step_ms"], trainer["median_step_ms"],
                     trainer["data_wait_ms"], f"{c['data_wait_share']:.2%}",
                     c["trainer_over_bare"]] + ([idle.get("trainer")] if with_idle else []))
    columns = ["", "mean step ms", "median ms", "data wait ms", "wait share", "x bare"]
    lines = [
        f"Training steps on {result['device']}: {result['model']}, batch "
        f"{result['batch_size']} at 64 px, cached latents, {result['steps_per_run']} steps per "
        f"run (first {result['warmup_steps']} not counted), best of {result['rounds']} rounds; "
        f"{m['cpus']} CPUs, {result['torch_threads']} torch threads, load "
        f"{m['load_average_1_5_15']} before, {result['machine_after']} after",
        format_table(columns + (["device idle"] if with_idle else []), rows),
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


def assembly_only(args) -> None:
    """BatchAssembler alone, from cache files written here; the page cache is warm, as in a
    running epoch."""
    rows, result = [], {"machine": machine(), "batch_size": args.batch_size, "cases": {}}
    for name, (latent_shape, embed_shapes) in ASSEMBLY_CASES.items():
        for keep in (0, 64):
            with tempfile.TemporaryDirectory() as tmp:
                assembler = cache_assembler(Path(tmp), latent_shape, embed_shapes, keep)
                b = args.batch_size
                batches = [MicroBatch(0, s, "d", "64x64", tuple(
                    BatchSample("d", f"{(s * b + k) % CACHED_SAMPLES}.png", "64x64", (64, 64),
                                f"caption {(s + k) % CACHED_CAPTIONS}") for k in range(b)))
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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where both sides train; cuda adds the device's idle share")
    parser.add_argument("--model-only", action="store_true",
                        help="time the bare step on synthetic latents only")
    parser.add_argument("--size", type=int, default=64, help="image side for --model-only")
    parser.add_argument("--assembly-only", action="store_true",
                        help="time batch assembly from cache files only")
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, steps=4, warmup=1, rounds=1, batch_size=1)
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
