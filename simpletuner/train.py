"""`python -m simpletuner.train --config CONFIG`, normally started by ./train.sh through
accelerate launch. Exit status (simpletuner/training/run/outcomes.py): 0 trained, 1 failure,
2 configuration problem (including an output_dir in use or holding an earlier run's
checkpoints, and a bucket smaller than the effective batch), 3 diverged, 75 preempted (resumable with resume_from_checkpoint 'latest')."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (DistributedDataParallelKwargs, InitProcessGroupKwargs,
                               ProjectConfiguration)
from diffusers.utils import logging as diffusers_logging
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers.utils import logging as transformers_logging

from simpletuner.configuration import ConfigError
from simpletuner.configuration.command_line import load_with_option_args
from simpletuner.helpers.caching.storage import CacheEntryError
from simpletuner.common.clean_exit import exit_process
from simpletuner.common.error_report import report_unexpected
from simpletuner.common.peer_watch import (
    PeerWatch, collective_timeout, record_stop, stopped_peers)
from simpletuner.helpers.metadata.startup import DataStartupError
from simpletuner.helpers.metadata.backends.base import IndexAgreementError
from simpletuner.helpers.metadata.backends.captions import CaptionError
from simpletuner.helpers.metadata.split import UndersizedBucketsError
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.checkpointing.manifest import CheckpointError
from simpletuner.training.run.output_dir_claim import output_dir_claimed
from simpletuner.training.adapters.lora import LoraTargetError
from simpletuner.training.adapters.lycoris_adapter import LycorisTargetError
from simpletuner.training.memory.sharding import ShardingError
from simpletuner.training.parallel.sequence import ContextParallelError
from simpletuner.training.run.outcomes import (EXIT_CONFIG, EXIT_FAILED, EXIT_PREEMPTED,
                                           EXIT_TRAINED, Diverged, Preempted, exit_status_for,
                                           record_exit_status)
from simpletuner.training.recipe import run_training
from simpletuner.training.run.preemption import PreemptionWatcher, StopRequested
from simpletuner.training.reporting.epoch_log import epoch_lines_to_file
from simpletuner.training.reporting.trackers import start_trackers, tracker_names

logger = logging.getLogger(__name__)

# Errors whose message says what to do: reported as one line per rank, without a traceback.
# A RankFailure is one when every rank's error it reports is; any other error is a bug whose
# traceback is logged and kept (common/error_report.py).
EXPECTED_ERRORS = (ConfigError, DataStartupError, IndexAgreementError, UndersizedBucketsError,
                   ModelFolderError, LoraTargetError, LycorisTargetError, CacheEntryError,
                   CaptionError, CheckpointError, Preempted, Diverged, ShardingError,
                   ContextParallelError)


def build_accelerator(training, peer_timeout: float) -> Accelerator:
    logging_dir = Path(training.output_dir) / "logs"
    # The process group's own timeout comes after PeerWatch's, which names the missing rank.
    process_group = InitProcessGroupKwargs(timeout=timedelta(seconds=peer_timeout + 120))
    # DDP must be told when a family's network leaves parameters without a gradient.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=get_adapter_class(
        training.model_family).ddp_find_unused_parameters)
    return Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=training.mixed_precision,
        log_with=list(tracker_names(training.report_to)) or None,
        project_config=ProjectConfiguration(project_dir=training.output_dir,
                                            logging_dir=str(logging_dir)),
        kwargs_handlers=[process_group, ddp])


def stop_waiting_rank(rank: int):
    """PeerWatch's on_stuck: this rank's one line and status, then out (its main thread is
    blocked in the collective, so the watcher thread ends the process)."""
    def on_stuck(message: str) -> None:
        print(f"[rank {rank}] training stopped (exit status {EXIT_FAILED}): {message}",
              file=sys.stderr)
        exit_process(record_exit_status(EXIT_FAILED))
    return on_stuck


def configure_logging(level_name: str) -> None:
    """The trainer's loggers at ``level_name`` (the loader resolved it); other libraries' at
    INFO or above, as their DEBUG lines (PIL's, per image chunk) would bury the trainer's."""
    level = logging.getLevelName(level_name)
    logging.basicConfig(level=max(level, logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("simpletuner").setLevel(level)
    # The libraries' own progress bars (transformers' "Loading weights" and "Writing model
    # shards", diffusers' "Loading pipeline components") are not the run's progress.
    transformers_logging.disable_progress_bar()
    diffusers_logging.disable_progress_bar()


def train(configuration, accelerator, watcher: PreemptionWatcher) -> None:
    """The run, holding the output_dir lock; trackers start only once it is held, so a refused
    run writes nothing into another run's logs."""
    training = configuration.training
    with output_dir_claimed(Path(training.output_dir), accelerator,
                            str(configuration.config_path)):
        start_trackers(accelerator, training)
        with epoch_lines_to_file(training.output_dir, main=accelerator.is_main_process):
            run_training(configuration, accelerator, watcher)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simpletuner.train", description=__doc__,
                                     allow_abbrev=False, epilog="Any other '--option value' "
                                     "overrides that config.json option.")
    parser.add_argument("--config", default="config/config.json")
    args, option_args = parser.parse_known_args(argv)
    try:
        configuration = load_with_option_args(args.config, option_args)
        peer_timeout = collective_timeout()
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(configuration.training.log_level)
    # Stop signals are the run's from here to the end (see training/run/preemption.py).
    with PreemptionWatcher(configuration.training.preemption_signals) as watcher:
        try:
            with watcher.stopping_at_once():
                accelerator = build_accelerator(configuration.training, peer_timeout)
        except StopRequested as stop:
            print(f"training stopped (exit status {EXIT_PREEMPTED}): {stop}", file=sys.stderr)
            return EXIT_PREEMPTED
        return train_and_report(configuration, accelerator, watcher, peer_timeout)


def stopped_with_peers(rank: int, stopped: dict[int, str], exc: Exception) -> int:
    """This rank's report when peers stopped on a signal before the first step."""
    peers = ", ".join(f"rank {peer} by {name}" for peer, name in sorted(stopped.items()))
    logger.debug("this rank's error after its peers stopped", exc_info=exc)
    print(f"[rank {rank}] training stopped (exit status {EXIT_PREEMPTED}): stopped before the "
          f"first step with its peers ({peers}); what was cached is kept: run again to "
          f"continue (here the stop showed as {type(exc).__name__})", file=sys.stderr)
    return EXIT_PREEMPTED


def train_and_report(configuration, accelerator, watcher: PreemptionWatcher,
                     peer_timeout: float) -> int:
    """The exit status; a failure is one line per rank (and an unexpected one's traceback)."""
    rank = accelerator.process_index
    peers = PeerWatch(peer_timeout, watcher.signals, stop_waiting_rank(rank))
    try:
        # Log lines go above the progress bar, never into it.
        with logging_redirect_tqdm(), peers:
            train(configuration, accelerator, watcher)
        return EXIT_TRAINED
    except StopRequested as stop:
        record_stop(stop.signal_name)
        print(f"[rank {rank}] training stopped (exit status {EXIT_PREEMPTED}): {stop}",
              file=sys.stderr)
        return EXIT_PREEMPTED
    except Exception as exc:
        stopped = stopped_peers()
        if stopped:  # a peer left on a signal: what broke here is its absence
            return stopped_with_peers(rank, stopped, exc)
        where = report_unexpected(exc, rank=rank, output_dir=configuration.training.output_dir,
                                  expected=EXPECTED_ERRORS)
        status = exit_status_for(exc)
        print(f"[rank {rank}] training stopped (exit status {status}): {exc}{where}",
              file=sys.stderr)
        return status
    finally:
        accelerator.end_training()


if __name__ == "__main__":
    exit_process(record_exit_status(main()))
