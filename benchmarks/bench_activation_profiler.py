"""The plan's activation estimate (training/memory/activations.py) against torch's profiler, on
the CPU, for each tiny transformer family, full and LoRA.

One forward and backward of a micro-batch (2 images, 64 x 96) runs under
``torch.profiler.profile(profile_memory=True)``; every CPU allocation and free the profiler
recorded (its ``[memory]`` events, bytes signed) is summed in time order from the step's
start, so the weights, allocated before, are left out. Two figures come from that curve:
the bytes live when the backward starts (what the forward left for it: autograd's saved
tensors and the loss) and the peak over the whole step. The estimate counts saved tensors,
so it is compared with the first; the peak adds the backward's working set (the gradients
of the activations in flight, and the parameters' gradients), which the plan's activation
figure does not include.

    python benchmarks/bench_activation_profiler.py [family ...]"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchlib import parse_with_smoke

from simpletuner.configuration.families import FLOW_FAMILIES
from simpletuner.configuration.options import TrainingConfig
from simpletuner.models.base import PLANNED_CAPTION, LossSettings
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.by_type import add_adapter
from simpletuner.training.memory.activations import activation_bytes
from simpletuner.training.memory.model import meta_network

HEIGHT, WIDTH, BATCH = 64, 96, 2
BACKWARD = "the backward"


def training_config(family: str, model_type: str) -> TrainingConfig:
    return TrainingConfig(model_family=family, model_type=model_type, lora_rank=4,
                          pretrained_model_name_or_path=f"builtin:tiny-{family}",
                          output_dir="unused", data_backend_config="unused")


def loaded_adapter(family: str, training: TrainingConfig):
    adapter = get_adapter_class(family).load(
        ensure_builtin_model(f"tiny-{family}"), device=torch.device("cpu"),
        weight_dtype=torch.float32, loss_settings=LossSettings.from_config(training))
    if training.model_type == "lora":
        add_adapter(adapter.trainable, type(adapter), training)
    return adapter


def micro_batch(adapter) -> TrainingBatch:
    pixels = torch.rand(BATCH, 3, HEIGHT, WIDTH, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return TrainingBatch(latents=adapter.encode_images(pixels * 2 - 1),
                             prompt_embeds=adapter.encode_prompts([PLANNED_CAPTION] * BATCH),
                             original_sizes=[(HEIGHT, WIDTH)] * BATCH,
                             crop_top_lefts=[(0, 0)] * BATCH,
                             target_sizes=[(HEIGHT, WIDTH)] * BATCH)


def profiled_step(adapter, batch: TrainingBatch) -> tuple[int, int]:
    """(bytes live when the backward starts, peak bytes) of one forward and backward, from
    the profiler's allocation events, counted from the step's start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        loss = adapter.compute_loss(batch, torch.Generator().manual_seed(0))
        with record_function(BACKWARD):
            loss.backward()
    events = profiler.profiler.kineto_results.events()
    backward_start = next(e.start_ns() for e in events if e.name() == BACKWARD)
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    level = peak = 0
    at_backward = None
    for event in memory:
        if at_backward is None and event.start_ns() >= backward_start:
            at_backward = level
        level += event.nbytes()
        peak = max(peak, level)
    return at_backward, peak


def compare(family: str, model_type: str) -> dict:
    training = training_config(family, model_type)
    adapter = loaded_adapter(family, training)
    at_backward, peak = profiled_step(adapter, micro_batch(adapter))
    folder = ensure_builtin_model(f"tiny-{family}")
    estimate = activation_bytes(type(adapter), folder, training,
                                meta_network(type(adapter), folder, training),
                                batch_size=BATCH, height=HEIGHT, width=WIDTH).saved
    return {"family": family, "model_type": model_type, "estimate": estimate,
            "at_backward": at_backward, "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=list(FLOW_FAMILIES))
    families = parse_with_smoke(parser, families=["flux"]).families
    print(f"{'family':<12}{'type':<6}{'estimate':>10}{'profiler':>10}{'ratio':>7}"
          f"{'peak':>10}{'ratio':>7}")
    for family in families:
        for model_type in ("full", "lora"):
            row = compare(family, model_type)
            print(f"{family:<12}{model_type:<6}{row['estimate']:>10}{row['at_backward']:>10}"
                  f"{row['at_backward'] / row['estimate']:>7.3f}{row['peak']:>10}"
                  f"{row['peak'] / row['estimate']:>7.3f}", flush=True)


if __name__ == "__main__":
    main()
