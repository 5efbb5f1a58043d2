"""The training run as an object, read top to bottom: ``set_up`` (preflight, data, model,
caches, sampler, optimization, checkpointer, resume), ``train`` (a flat loop of ``train_step``,
one optimizer step, and ``after_step``, what follows it), then ``export``.

Every rank runs this same code. Collectives happen at the same points on every rank (start-up,
caching, the one per-step reduce, checkpoint barriers), and every decision that could differ
between ranks (skip a non-finite step, stop on a signal) is made from data every rank has.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from simpletuner.common.peer_watch import in_collective
from simpletuner.common.together import failing_together
from simpletuner.configuration import Configuration
from simpletuner.helpers.caching.prepare import prepare_caches
from simpletuner.helpers.metadata.startup import (build_sampler, report_skipped_files_together,
                                                  skipped_files, start_data)
from simpletuner.helpers.metadata.mesh import Mesh
from simpletuner.helpers.multiaspect.batch import MicroBatch
from simpletuner.helpers.multiaspect.prefetch import PrefetchedBatches
from simpletuner.helpers.multiaspect.trace import TraceWriter
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.prior_preservation import adapter_turned_off
from simpletuner.training.checkpointing.checkpointer import Checkpointer, TrainedParts
from simpletuner.training.adapters.assistant import assistant_in_validation
from simpletuner.training.compilation import CompileClock
from simpletuner.training.ema import EMAWeights
from simpletuner.training.export import export_run
from simpletuner.training.memory.block_swap import network_to_device
from simpletuner.training.memory.offload import release_frozen_components
from simpletuner.training.parallel.sequence import (gradient_scale, sequence_whole,
                                                     shard_sequence)
from simpletuner.training.memory.sharding import (accumulating, network_on_main, prepare,
                                                  shard_network)
from simpletuner.training.model_setup import load_trained_model
from simpletuner.training.optimization.optimizers import build_optimizer
from simpletuner.training.optimization.schedules import build_lr_scheduler, scheduled_lr
from simpletuner.training.preflight import run_preflight_on_all_ranks, weight_dtype
from simpletuner.training.reporting.evaluation import Evaluator
from simpletuner.training.reporting.run_start import new_run_log, start_run_log
from simpletuner.training.reporting.validation import is_validation_step, validate_model
from simpletuner.training.reporting.validation_edits import EditPairs
from simpletuner.training.run.leftovers import remove_leftovers
from simpletuner.training.run.outcomes import Preempted
from simpletuner.training.run.preemption import PreemptionWatcher
from simpletuner.training.run.requests import RunRequests
from simpletuner.training.run.run_warnings import resumed_lr_warning, run_warnings
from simpletuner.training.run_state import RunState, noise_generator, total_steps
from simpletuner.training.settings import RunSettings
from simpletuner.training.step_guard import (NonFiniteGuard, StepTotals, back_off_loss_scale,
                                             clip_gradients, diverged_error, nonfinite_warning,
                                             pack_step, reduce_step, stop_requested_anywhere)

logger = logging.getLogger(__name__)

MicroBatches = Iterator[tuple[MicroBatch, TrainingBatch]]


@dataclass
class TrainingResult:
    steps: int
    final_loss: float | None
    pipeline_dir: Path | None


class Trainer:
    """One run. ``set_up`` leaves on the object: ``preflight``, ``data`` (the start-up indexes
    and the shared ``seed``), ``adapter`` (the model family), ``caches``, ``sampler``,
    ``parts`` (what a checkpoint saves besides the state) and ``prepared`` (the network as
    accelerate wraps it), ``checkpointer``, ``state`` (RunState: step, epoch, seed, final loss,
    the guard's bad steps), ``guard``, ``evaluator``, ``trace`` and ``edit_pairs`` (what
    validation edits, with eval_dataset_id). ``watcher`` (stop signals)
    is there from the start: before the first step a signal stops the run at once, in the loop
    at the next step with a checkpoint, during the export once the export is complete."""

    def __init__(self, configuration: Configuration, accelerator,
                 watcher: PreemptionWatcher | None = None):
        """``watcher``: the entry point's, installed before the accelerator was built."""
        self.configuration = configuration
        self.training = configuration.training
        self.accelerator = accelerator
        self.settings = RunSettings.from_config(self.training)
        self.output_dir = Path(self.training.output_dir)
        self.weight_dtype = weight_dtype(self.training.mixed_precision)
        self.watcher = watcher or PreemptionWatcher(self.training.preemption_signals)
        self.run_log = new_run_log(self.output_dir, main=accelerator.is_main_process)
        self.requests = RunRequests(self.output_dir, main=accelerator.is_main_process)
        # is_regularisation_data: their targets are the base model's predictions
        self.regularisation = {ds.id for ds in configuration.datasets if ds.is_regularisation_data}

    def run(self) -> TrainingResult:
        try:
            with self.watcher:
                with self.watcher.stopping_at_once():  # nothing to checkpoint before step 1
                    self.set_up()
                self.train()
                with self.watcher.finishing("the export"):
                    result = self.export()
        except BaseException as exc:  # the report says how the run ended, then it goes on
            self.run_log.end_with(exc)
            raise
        self.run_log.finish()
        return result

    # ---- set-up, in the order every rank runs it -------------------------------------------

    def set_up(self) -> None:
        # Everything that can be checked cheaply, on every rank, before any heavy work.
        self.preflight = run_preflight_on_all_ranks(self.configuration, self.accelerator)
        self.run_log.output_dir_accepted(resumed_from=self.preflight.resume_step)
        with failing_together("removing what an earlier run left"):  # this run holds the lock
            if self.accelerator.is_main_process:
                remove_leftovers(self.output_dir)
        # Index, agree, shared seed (collectives inside, same on every rank).
        self.data = start_data(self.configuration, self.accelerator, seed=self.preflight.seed)
        self.seed = self.data.seed
        # From the indexes, before any heavy work: a dataset that would never join the schedule.
        total_steps(self.training, build_sampler(self.data, self.training, self.accelerator))
        self.adapter, self.block_swap = load_trained_model(
            self.training, self.settings, model_folder=self.preflight.model_folder,
            resume_from=self.preflight.resume_from, seed=self.seed,
            device=self.accelerator.device, weight_dtype=self.weight_dtype,
            rank=self.accelerator.process_index)
        self.caches = self._prepare_caches()
        self.edit_pairs = EditPairs.select(self.configuration, self.data, self.caches.indexes)
        release_frozen_components(self.adapter, self.settings.offload, self.weight_dtype)
        self.sampler = self._build_sampler()
        self.total_steps = total_steps(self.training, self.sampler)
        self.parts, self.prepared = self._build_optimization()
        self.checkpointer = Checkpointer(
            self.accelerator, self.output_dir, limit=self.training.checkpoints_total_limit,
            gather_full=self.settings.sharding.fsdp_state_dict_type == "FULL_STATE_DICT",
            resumed_from=self.preflight.resume_from)
        self.state = self._resume_or_start()
        self.last_checkpoint = self.preflight.resume_from  # (a folder of this step or None)
        self.guard = NonFiniteGuard(self.training.max_nonfinite_steps,
                                    loss_scaled=self.accelerator.scaler is not None,
                                    bad_steps=self.state.nonfinite_steps)
        self.evaluator = self._build_evaluator()
        self.trace = self._open_trace()
        self._report_start()
        self.compile_clock, self.compiling = CompileClock(), 0.0  # dynamo_backend's steps

    def _prepare_caches(self):
        """VAE latents and text embeddings; undecodable images are dropped on every rank alike."""
        return prepare_caches(
            self.configuration.datasets, self.data.indexes,
            {i: b.caption_for for i, b in self.data.backends.items()},
            self.adapter.encode_for_cache, self.adapter.encode_prompts,
            model_folder=self.preflight.model_folder, family=self.training.model_family,
            output_dir=self.output_dir, seed=self.seed, rank=self.accelerator.process_index,
            world_size=self.accelerator.num_processes, vae_batch_size=self.training.vae_batch_size,
            progress=self.accelerator.is_local_main_process,
            conditioning=self.data.conditioning(self.configuration.references),
            prompts_see_references=self.adapter.prompts_see_references,
            audio=self.adapter.audio_input, encode_control=self.adapter.encode_control)

    def _build_sampler(self):
        sampler = build_sampler(self.data, self.training, self.accelerator,
                                indexes=self.caches.indexes)
        if len(sampler) == 0:
            raise ValueError("the datasets give no micro-batch to train on; run "
                             "`python -m simpletuner plan` to see the buckets")
        self.accumulation = sampler.accumulation
        return sampler

    def _build_optimization(self) -> tuple[TrainedParts, torch.nn.Module]:
        """The LR scheduler is not handed to accelerate (which would step it once per process);
        the checkpointer saves its state as JSON."""
        network = self.adapter.trainable
        mesh = Mesh(self.accelerator.num_processes, self.training.context_parallel_size)
        if mesh.context_parallel > 1:  # before DDP wraps it: its sequence split over the group
            shard_sequence(network, mesh, self.accelerator.process_index, self.accelerator.device)
        if self.settings.sharding.fsdp_enable:  # before the optimizer: its parameters are shards
            shard_network(network, self.settings.sharding, self.accelerator.device.type)
        optimizer = build_optimizer(network, self.settings.optimizer)
        lr_scheduler = build_lr_scheduler(self.settings.schedule, optimizer, self.total_steps)
        prepared, optimizer = prepare(self.accelerator, network, optimizer)
        ema = EMAWeights.for_run(network, self.training) if self.training.use_ema else None
        return TrainedParts(network, optimizer, lr_scheduler, self.sampler, ema), prepared

    def _resume_or_start(self) -> RunState:
        """A fresh state, or the checkpoint's with this run's seed, plan and position."""
        fresh = RunState(step=0, epoch=0, seed=self.seed, fingerprint=self.sampler.fingerprint(),
                         model_type=self.training.model_type)
        resume_from = self.preflight.resume_from
        if resume_from is None:
            return fresh
        state = self.checkpointer.load(resume_from, self.parts)
        logger.info("resumed from %s at step %d (epoch %d)", resume_from, state.step,
                    self.sampler.epoch)
        schedule = self.parts.lr_scheduler  # its loaded state holds the LR saved with it
        warning = resumed_lr_warning(state.step, schedule.get_last_lr()[0],
                                     scheduled_lr(schedule, state.step))
        if warning and self.accelerator.is_main_process:
            logger.warning(warning)
        return replace(fresh, step=state.step, epoch=self.sampler.epoch,
                       final_loss=state.final_loss, nonfinite_steps=state.nonfinite_steps)

    def _build_evaluator(self) -> Evaluator | None:
        settings = self.settings.evaluation
        if not settings.eval_steps_interval:
            return None
        sampler = build_sampler(self.data, self.training, self.accelerator,
                                indexes=self.caches.indexes, evaluation=True)
        return Evaluator(sampler, self.caches.assembler, self.adapter, self.parts.network,
                         seed=self.seed, settings=settings, accelerator=self.accelerator)

    def _open_trace(self) -> TraceWriter | None:
        if not self.training.trace_samples:
            return None
        resumed = self.preflight.resume_from is not None
        return TraceWriter(self.output_dir / "trace", self.accelerator.process_index,
                           resume_at=(self.sampler.epoch, self.sampler.step) if resumed else None,
                           group=self.sampler.rank if self.sampler.context_parallel > 1
                           else None)

    def _report_start(self) -> None:
        training, main = self.training, self.accelerator.is_main_process
        world = self.accelerator.num_processes
        reported = self.caches.reported(self.data.references)
        report_skipped_files_together(reported, self.output_dir, self.accelerator)
        start_run_log(self.run_log, training=training, data=self.data, sampler=self.sampler,
                      indexes=self.caches.indexes, skipped=skipped_files(reported),
                      total_steps=self.total_steps, processes=world)
        if not main:
            return
        for warning in run_warnings(training, world, self.total_steps - self.state.step):
            logger.warning(warning)
        logger.info("training %s (%s) for %d steps: %d micro-batches of up to %d per rank in "
                    "epoch %d, accumulation %d, %d processes, seed %d", training.model_family,
                    training.model_type, self.total_steps, len(self.sampler),
                    training.train_batch_size, self.sampler.epoch, self.accumulation, world,
                    self.seed)

    # ---- the loop ---------------------------------------------------------------------------

    def train(self) -> None:
        """Micro-batches from the lockstep sampler, one optimizer step per ``accumulation`` of
        them (a group never crosses buckets or epochs, see the sampler)."""
        validation = self.settings.validation
        if validation.validation_on_startup and validation.enabled:
            self.validate()  # SimpleTuner's validation_on_startup: the starting weights
        self.parts.network.train()
        with ExitStack() as stack:
            stack.enter_context(self.watcher)
            self.progress = stack.enter_context(tqdm(
                total=self.total_steps, initial=self.state.step, desc="steps",
                disable=not self.accelerator.is_main_process))
            if self.trace is not None:
                stack.enter_context(self.trace)
            micro_batches = stack.enter_context(closing(iter(PrefetchedBatches(
                self.sampler, self.caches.assembler, device=self.accelerator.device))))
            while self.state.step < self.total_steps:
                self.after_step(self.train_step(micro_batches))
            self._stop_if_signalled_after_the_last_step()

    def train_step(self, micro_batches: MicroBatches) -> StepTotals:
        """One optimizer step: accumulate, clip, then one reduce tells every rank the loss,
        whether anything was non-finite and whether a stop signal arrived anywhere, so all skip,
        stop or diverge at the same step. A skipped step still advances the step, as the
        sampler has advanced past its data: step count and sample sequence stay those of an
        uninterrupted run. Only applied steps move the LR schedule and the EMA."""
        loss_sum = torch.zeros((), device=self.accelerator.device)  # read once, in the reduce
        samples: list[str] = []
        for index in range(self.accumulation):
            micro_batch, batch = next(micro_batches)
            loss_sum += self._forward_backward(micro_batch, batch,
                                               sync=index == self.accumulation - 1)
            samples += [f"{s.dataset_id}/{s.sample_id}" for s in micro_batch.samples]
        with in_collective(f"step {self.state.step + 1}: clipping and reduce"):
            norm = clip_gradients(self.accelerator, self.prepared.parameters(),
                                  self.training.max_grad_norm,
                                  self.training.grad_clip_method)
            local, totals = reduce_step(self.accelerator, pack_step(
                loss_sum, self.accumulation, norm, stopping=self.watcher.requested is not None,
                asked=self.requests.pending()))
        self.state.step += 1
        self.state.epoch = self.sampler.epoch
        if self.guard.should_apply(totals, self.state.step):
            self._apply(totals)
        else:
            self._skip(totals, local, samples, micro_batch.epoch)
        self.parts.optimizer.zero_grad(set_to_none=True)
        self.state.nonfinite_steps = list(self.guard.bad_steps)
        self.compiling = self.compile_clock.take()  # torch.compile's part of the step
        self.run_log.log_step(self.state.step, totals.mean_loss,
                              self.parts.lr_scheduler.get_last_lr()[0],
                              skipped=self.state.step in self.guard.bad_steps,
                              compiling=self.compiling)
        if self.guard.diverged:
            raise diverged_error(self.guard.bad_steps, self.training)
        if self.guard.bad_steps and self.state.step == self.total_steps:
            # The last step skipped: the weights are those that gave NaN/inf, whatever the
            # streak's length, so they are neither saved as the last step nor exported.
            raise diverged_error(self.guard.bad_steps, self.training, at_the_end=True)
        return totals

    def _forward_backward(self, micro_batch: MicroBatch, batch: TrainingBatch, *,
                          sync: bool) -> torch.Tensor:
        if self.trace is not None:
            self.trace.write(micro_batch)
        with (in_collective(f"step {self.state.step + 1}: micro-batch {micro_batch.step}"),
              accumulating(self.accelerator, self.prepared, sync)):
            base_model = None
            if micro_batch.dataset_id in self.regularisation:  # the same on every rank
                base_model = partial(adapter_turned_off, self.parts.network)
            with self.accelerator.autocast():
                loss = self.adapter.compute_loss(
                    batch, noise_generator(self.seed, self.sampler.rank,  # the dp group
                                           micro_batch.epoch, micro_batch.step),
                    network=self.prepared, base_model=base_model)
            # x C with a sharded sequence (training/parallel/sequence.py)
            self.accelerator.backward(loss * gradient_scale(self.parts.network)
                                      / self.accumulation)
        return loss.detach().float()

    def _apply(self, totals: StepTotals) -> None:
        self.parts.optimizer.step()
        self.parts.lr_scheduler.step()
        if self.parts.ema is not None:
            self.parts.ema.update(self.parts.network, self.state.step)
        self.state.final_loss = totals.mean_loss

    def _skip(self, totals: StepTotals, local: StepTotals, samples: list[str],
              epoch: int) -> None:
        logger.warning(nonfinite_warning(
            totals, local, step=self.state.step, epoch=epoch,
            world=self.accelerator.num_processes, consecutive=len(self.guard.bad_steps),
            limit=self.training.max_nonfinite_steps, samples=samples))
        back_off_loss_scale(self.accelerator)

    def after_step(self, totals: StepTotals) -> None:
        """Log, checkpoint, stop on a signal (with a checkpoint), validate, evaluate."""
        step = self.state.step
        self._log_step(totals)
        self.requests.answered(totals)
        saved = None
        every = self.training.checkpointing_steps
        # The last step is always saved: a finished run can be continued with more steps.
        if (every and step % every == 0) or step == self.total_steps or totals.checkpoint_asked:
            saved = self.checkpoint()
            self.run_log.render()  # (a preemption's checkpoint: by Trainer.run, outside the save)
        if totals.stopping:
            with self.watcher.aborting_on_signal():
                saved = saved or self.checkpoint()
            raise Preempted(self.watcher.requested or "a stop signal on another rank", step,
                            saved)
        if self._validation_due(step, totals):
            self.validate()
        if self.evaluator is not None and self.evaluator.is_due(step):
            self.run_log.events.eval(step, self.evaluator.run(step))

    def _validation_due(self, step: int, totals: StepTotals) -> bool:
        """On its schedule, or asked for from outside (training/run/requests.py)."""
        settings = self.settings.validation
        if totals.validation_asked and not settings.enabled:
            if self.accelerator.is_main_process:
                logger.warning("a validation was asked for at step %d, but this run validates "
                               "nothing (no validation_prompt)", step)
            return False
        return is_validation_step(settings, step, self.total_steps) or bool(
            totals.validation_asked)

    def _stop_if_signalled_after_the_last_step(self) -> None:
        """A signal during the last step's validation or evaluation reached no step's reduce:
        every rank agrees here, and the run stops as preempted (its last step is saved)."""
        if stop_requested_anywhere(self.accelerator, self.watcher.requested is not None):
            raise Preempted(self.watcher.requested or "a stop signal on another rank",
                            self.state.step, self.last_checkpoint)

    def _log_step(self, totals: StepTotals) -> None:
        lr = self.parts.lr_scheduler.get_last_lr()[0]
        # Redrawn by update() at tqdm's interval, not forced every step.
        compiling = {"compiling": f"{self.compiling:.1f}s"} if self.compiling else {}
        self.progress.set_postfix(loss=f"{totals.mean_loss:.4f}", lr=f"{lr:.2e}",
                                  epoch=self.state.epoch, refresh=False, **compiling)
        if self.compiling:
            logger.info("step %d: %.1f s of it compiling (dynamo_backend)", self.state.step,
                        self.compiling)
        self.progress.update(1)
        self.accelerator.log({"train/loss": totals.mean_loss, "train/lr": lr},
                             step=self.state.step)

    def checkpoint(self) -> Path:
        self.last_checkpoint = self.checkpointer.save(self.state, self.parts)
        self.run_log.events.checkpoint(self.state.step, self.last_checkpoint)
        return self.last_checkpoint

    def validate(self) -> None:
        """With EMA weights swapped in on every rank (each swaps its own shards under FSDP2).
        Main rank only; leaving the block is the barrier, and its error reaches every rank."""
        ema, network = self.parts.ema, self.parts.network
        if ema is not None:
            ema.swap(network)
        try:
            with sequence_whole(network):  # the main rank generates alone
                self._validate_on_main()
        finally:
            if ema is not None:
                ema.swap(network)
        self.run_log.render()

    def _validate_on_main(self) -> None:
        trained = network_on_main(self.accelerator, self.prepared)
        with (failing_together(f"validation at step {self.state.step}"),
              assistant_in_validation(self.parts.network, self.training)):
            if self.accelerator.is_main_process:
                self.run_log.events.validation(self.state.step, validate_model(
                    self.adapter, self.settings.validation, self.state.step,
                    edit_pairs=self.edit_pairs, datasets=self.configuration.datasets,
                    indexes=self.caches.indexes, trainable=network_to_device(
                        trained, self.accelerator.device, self.block_swap),
                    accelerator=self.accelerator, autocast_dtype=self.weight_dtype))

    # ---- the end ----------------------------------------------------------------------------

    def export(self) -> TrainingResult:
        """The trained pipeline (EMA weights when enabled), the summary and the model card."""
        parts = self.parts
        pipeline_dir = export_run(self.configuration, self.accelerator, self.adapter,
                                  parts.network, self.prepared, parts.ema, step=self.state.step,
                                  seed=self.seed, final_loss=self.state.final_loss)
        return TrainingResult(self.state.step, self.state.final_loss, pipeline_dir)


def run_training(configuration: Configuration, accelerator,
                 watcher: PreemptionWatcher | None = None) -> TrainingResult:
    return Trainer(configuration, accelerator, watcher).run()
