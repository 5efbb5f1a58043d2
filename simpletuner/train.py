"""`python -m simpletuner.train --config CONFIG`, normally started by ./train.sh through
accelerate launch. Exit status: 0 trained, 2 configuration problem, 3 diverged, 75 preempted
(resumable), 1 any other failure."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

from simpletuner.configuration import ConfigError
from simpletuner.configuration.command_line import load_with_option_args
from simpletuner.helpers.caching.storage import CacheEntryError
from simpletuner.helpers.metadata.startup import DataStartupError
from simpletuner.helpers.metadata.backends.base import IndexAgreementError
from simpletuner.helpers.metadata.split import UndersizedBucketsError
from simpletuner.models.base import ModelFolderError
from simpletuner.training.lora import LoraTargetError
from simpletuner.training.outcomes import EXIT_DIVERGED, EXIT_PREEMPTED, Diverged, Preempted
from simpletuner.training.recipe import run_training

# Errors whose message says what to do: reported as one line per rank, without a traceback.
EXPECTED_ERRORS = (ConfigError, DataStartupError, IndexAgreementError, UndersizedBucketsError,
                   ModelFolderError, LoraTargetError, CacheEntryError)


def build_accelerator(training) -> Accelerator:
    logging_dir = Path(training.output_dir) / "logs"
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        mixed_precision=training.mixed_precision,
        log_with="tensorboard" if training.report_to == "tensorboard" else None,
        project_config=ProjectConfiguration(project_dir=training.output_dir,
                                            logging_dir=str(logging_dir)))
    if training.report_to == "tensorboard":
        accelerator.init_trackers("simpletuner")
    return accelerator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simpletuner.train", description=__doc__,
                                     allow_abbrev=False, epilog="Any other '--option value' "
                                     "overrides that config.json option.")
    parser.add_argument("--config", default="config/config.json")
    args, option_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        configuration = load_with_option_args(args.config, option_args)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    accelerator = build_accelerator(configuration.training)
    try:
        run_training(configuration, accelerator)
        return 0
    except (Preempted, Diverged) as exc:
        print(f"[rank {accelerator.process_index}] {exc}", file=sys.stderr)
        return EXIT_PREEMPTED if isinstance(exc, Preempted) else EXIT_DIVERGED
    except EXPECTED_ERRORS as exc:
        print(f"[rank {accelerator.process_index}] training stopped: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    finally:
        accelerator.end_training()


if __name__ == "__main__":
    sys.exit(main())
