"""The full fine-tuning recipe, top to bottom: data start-up, caches, sampler, model, optimizer,
then the loop with checkpoints and validation, then the export (export.py).

Every rank runs this same code. Collectives happen at the same points on every rank (start-up,
caching, the one per-step reduce, checkpoint barriers), and every decision that could differ
between ranks (skip a non-finite step, stop on a signal) is made from data every rank has.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from simpletuner.configuration import Configuration
from simpletuner.helpers.caching.prepare import prepare_caches
from simpletuner.helpers.metadata.permutation import stable_seed
from simpletuner.helpers.metadata.startup import build_sampler, report_skipped_files, start_data
from simpletuner.helpers.multiaspect.prefetch import PrefetchedBatches
from simpletuner.helpers.multiaspect.trace import TraceWriter
from simpletuner.common.together import failing_together
from simpletuner.models.base import LossSettings
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.checkpointing.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from simpletuner.training.ema import EMAWeights
from simpletuner.training.reporting.evaluation import build_evaluator
from simpletuner.training.export import export_run
from simpletuner.training.lora import add_lora
from simpletuner.training.memory.offload import release_frozen_components
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.run.outcomes import Preempted
from simpletuner.training.run.preemption import PreemptionWatcher
from simpletuner.training.preflight import run_preflight_on_all_ranks, weight_dtype
from simpletuner.training.memory.quantization import quantize_frozen_weights
from simpletuner.training.memory.sharding import accumulating, network_on_main, prepare, shard_network
from simpletuner.training.step_guard import (NonFiniteGuard, back_off_loss_scale, diverged_error,
                                             gradient_norm, nonfinite_warning, pack_step,
                                             reduce_step)
from simpletuner.training.run.run_warnings import run_warnings
from simpletuner.training.optimization.schedules import build_lr_scheduler
from simpletuner.training.reporting.validation import (is_validation_step, run_validation,
                                             validation_prompts)

logger = logging.getLogger(__name__)

LR_SCHEDULER_STATE = "lr_scheduler.json"


@dataclass
class TrainingResult:
    steps: int
    final_loss: float | None
    pipeline_dir: Path | None


def _noise_generator(seed: int, rank: int, epoch: int, step: int) -> torch.Generator:
    """Noise and timesteps of a micro-batch depend only on where it is in the run, so a
    resumed run draws exactly what the uninterrupted one drew."""
    return torch.Generator(device="cpu").manual_seed(
        stable_seed("noise", seed, rank, epoch, step) & (2**63 - 1))


def _total_steps(training, steps_per_epoch: int) -> int:
    if training.max_train_steps is not None:
        return training.max_train_steps
    return training.num_train_epochs * steps_per_epoch


def run_training(configuration: Configuration, accelerator) -> TrainingResult:
    training = configuration.training
    output_dir = Path(training.output_dir)
    rank, world = accelerator.process_index, accelerator.num_processes
    main = accelerator.is_main_process

    # 1. Everything that can be checked cheaply, on every rank, before any heavy work.
    preflight = run_preflight_on_all_ranks(configuration, accelerator)
    training.seed = preflight.seed

    # 2. Data: index, agree, shared seed (collectives inside, same on every rank).
    startup = start_data(configuration, accelerator)
    seed = startup.seed

    # 3. Model and caches. The caches drop undecodable images on every rank alike.
    # Loaded, cast and quantized on the CPU, then moved: the device never holds an fp32 copy.
    # A rank that cannot load the model stops every rank before the caches' collectives.
    with failing_together("loading the model"):
        adapter = get_adapter_class(training.model_family).load(
            preflight.model_folder, device=torch.device("cpu"),
            weight_dtype=weight_dtype(training.mixed_precision),
            loss_settings=LossSettings.from_config(training))
        quantize_frozen_weights(adapter, training, weight_dtype(training.mixed_precision))
        adapter.move_to(accelerator.device)
        lora = training.model_type == "lora"
        if lora:  # freeze the network, train an adapter; checkpoints hold the adapter only
            # A's random start comes from the run's seed: the same adapter under DDP and FSDP2.
            with torch.random.fork_rng():  # manual_seed seeds CUDA too; both restored after
                torch.manual_seed(stable_seed("lora init", seed) & (2**63 - 1))
                add_lora(adapter.trainable, type(adapter), rank=training.lora_rank,
                         alpha=training.lora_alpha, dropout=training.lora_dropout,
                         target_modules=training.lora_target_modules)
        adapter.set_gradient_checkpointing(training.gradient_checkpointing)
    caches = prepare_caches(
        configuration.datasets, startup.indexes,
        {i: b.caption_for for i, b in startup.backends.items()},
        adapter.encode_images, adapter.encode_prompts, model_folder=preflight.model_folder,
        family=training.model_family, output_dir=output_dir, seed=seed, rank=rank,
        world_size=world, progress=accelerator.is_local_main_process)
    release_frozen_components(adapter, training, weight_dtype(training.mixed_precision))
    sampler = build_sampler(startup, training, accelerator, indexes=caches.indexes)
    accumulation = sampler.accumulation
    if len(sampler) == 0:
        raise ValueError("the datasets give no micro-batch to train on; run "
                         "`python -m simpletuner plan` to see the buckets")
    steps_per_epoch = len(sampler) // accumulation
    total_steps = _total_steps(training, steps_per_epoch)

    # 4. Optimizer and schedule. The LR scheduler is not handed to accelerate (which would step
    # it once per process); its state is saved as JSON with each checkpoint.
    network = adapter.trainable
    if training.fsdp_enable:  # before the optimizer is built: its parameters are the shards
        shard_network(network, training, accelerator.device.type)
    optimizer = build_optimizer(network, training)
    lr_scheduler = build_lr_scheduler(training, optimizer, total_steps)
    prepared_network, optimizer = prepare(accelerator, network, optimizer)
    ema = EMAWeights(network, training.ema_decay) if training.use_ema else None

    step, resumed = 0, preflight.resume_from is not None
    if resumed:
        state, sampler_state = load_checkpoint(preflight.resume_from, rank=rank,
                                               network=network, optimizer=optimizer, ema=ema)
        lr_scheduler.load_state_dict(
            json.loads((preflight.resume_from / LR_SCHEDULER_STATE).read_text()))
        sampler.load_state_dict(sampler_state)
        step = state.step
        logger.info("resumed from %s at step %d (epoch %d)", preflight.resume_from, step,
                    sampler.epoch)

    evaluator = build_evaluator(training, startup, caches, adapter, network, accelerator)
    if main:
        for warning in run_warnings(training, world, total_steps - step):
            logger.warning(warning)
    trace = (TraceWriter(output_dir / "trace", rank,
                         resume_at=(sampler.epoch, sampler.step) if resumed else None)
             if training.trace_samples else None)
    if main:
        report_skipped_files(caches.indexes, output_dir)
    if main:
        logger.info("training %s (%s) for %d steps: %d micro-batches of up to %d per rank per "
                    "epoch, accumulation %d, %d processes, seed %d", training.model_family,
                    training.model_type, total_steps, len(sampler), training.train_batch_size,
                    accumulation, world, seed)

    def checkpoint() -> Path:
        state = TrainerState(step=step, epoch=sampler.epoch, seed=seed,
                             fingerprint=sampler.fingerprint(), model_type=training.model_type)
        # save_checkpoint logs the folder once
        return save_checkpoint(accelerator, output_dir, state, network=network,
                               optimizer=optimizer, sampler_state=sampler.state_dict(), ema=ema,
                               limit=training.checkpoints_total_limit,
                               extra_json={LR_SCHEDULER_STATE: lr_scheduler.state_dict()},
                               resumed_from=preflight.resume_from,
                               gather_full=training.fsdp_state_dict_type == "FULL_STATE_DICT")

    def validate() -> None:
        # With EMA weights swapped in on every rank (each swaps its own shards under FSDP2).
        # Main rank only; leaving the block is the barrier, and its error reaches every rank.
        if ema is not None:
            ema.swap(network)
        try:
            trained = network_on_main(accelerator, prepared_network)
            with failing_together(f"validation at step {step}"):
                if main:
                    run_validation(adapter, training, step,
                                   trainable=trained.to(accelerator.device),
                                   accelerator=accelerator,
                                   autocast_dtype=weight_dtype(training.mixed_precision))
        finally:
            if ema is not None:
                ema.swap(network)

    # 5. The loop: micro-batches from the lockstep sampler, one optimizer step per
    # `accumulation` of them (a group never crosses buckets or epochs, see the sampler).
    # At each step one reduce tells every rank the loss, whether anything was non-finite and
    # whether a stop signal arrived anywhere, so all skip, stop or diverge at the same step.
    if training.validation_on_startup and validation_prompts(training):
        validate()  # SimpleTuner's validation_on_startup: images of the starting weights
    progress = tqdm(total=total_steps, initial=step, desc="steps", disable=not main)
    guard = NonFiniteGuard(training.max_nonfinite_steps, loss_scaled=accelerator.scaler is not None)
    loss_sum = torch.zeros((), device=accelerator.device)  # read once per step, in the reduce
    step_samples: list[str] = []
    final_loss = None  # the mean loss of the last applied step: always finite
    network.train()
    try:
        with PreemptionWatcher(training.preemption_signals) as watcher:
            while step < total_steps:
                for micro_batch, batch in PrefetchedBatches(sampler, caches.assembler,
                                                            device=accelerator.device):
                    if trace is not None:
                        trace.write(micro_batch)
                    step_samples += [f"{s.dataset_id}/{s.sample_id}" for s in micro_batch.samples]
                    sync = (micro_batch.step + 1) % accumulation == 0
                    with accumulating(accelerator, prepared_network, sync):
                        with accelerator.autocast():
                            loss = adapter.compute_loss(
                                batch, _noise_generator(seed, rank, micro_batch.epoch,
                                                        micro_batch.step),
                                network=prepared_network)
                        accelerator.backward(loss / accumulation)
                    loss_sum += loss.detach().float()
                    if not sync:
                        continue
                    norm = gradient_norm(accelerator, prepared_network.parameters(),
                                         training.max_grad_norm)
                    local, totals = reduce_step(accelerator, pack_step(
                        loss_sum, accumulation, norm, stopping=watcher.requested is not None))
                    # A skipped step still advances `step`, as the sampler has advanced past its
                    # data: step count and sample sequence stay those of an uninterrupted run, so
                    # resume stays exact. Only applied steps move the LR schedule and the EMA.
                    step += 1
                    if guard.should_apply(totals, step):
                        optimizer.step()
                        lr_scheduler.step()
                        if ema is not None:
                            ema.update(network)
                        final_loss = totals.mean_loss
                    else:
                        logger.warning(nonfinite_warning(
                            totals, local, step=step, epoch=micro_batch.epoch, world=world,
                            consecutive=len(guard.bad_steps),
                            limit=training.max_nonfinite_steps, samples=step_samples))
                        back_off_loss_scale(accelerator)
                    optimizer.zero_grad(set_to_none=True)
                    loss_sum.zero_()
                    step_samples.clear()
                    if guard.diverged:
                        raise diverged_error(guard.bad_steps, training)
                    lr = lr_scheduler.get_last_lr()[0]
                    # Redrawn by update() at tqdm's interval, not forced every step.
                    progress.set_postfix(loss=f"{totals.mean_loss:.4f}", lr=f"{lr:.2e}",
                                         epoch=micro_batch.epoch, refresh=False)
                    progress.update(1)
                    accelerator.log({"train/loss": totals.mean_loss, "train/lr": lr}, step=step)
                    saved = None
                    if training.checkpointing_steps and step % training.checkpointing_steps == 0:
                        saved = checkpoint()
                    if totals.stopping:
                        with watcher.aborting_on_signal():
                            saved = saved or checkpoint()
                        raise Preempted(watcher.requested or "a stop signal on another rank",
                                        step, saved)
                    if is_validation_step(training, step, total_steps):
                        validate()
                    if evaluator is not None and evaluator.is_due(step):
                        evaluator.run(step)
                    if step >= total_steps:
                        break
    finally:
        progress.close()
        if trace is not None:
            trace.close()

    # 6. Export, with EMA weights when enabled, the summary and the model card.
    pipeline_dir = export_run(configuration, accelerator, adapter, network, prepared_network, ema,
                              step=step, seed=seed, final_loss=final_loss)
    return TrainingResult(step, final_loss, pipeline_dir)
