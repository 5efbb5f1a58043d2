"""Several training runs, one after the other, by the processes of one launch: the runs of a
comparison (a DDP run and its FSDP2 twin) share the interpreters, the torch import and the
process group instead of paying a launch each. Each run is the trainer's own
(``run_training``), as ``python -m simpletuner.train`` runs it; ./train.sh has its own tests.

    torchrun --standalone --nproc_per_node N training_sequence_runner.py CONFIG [CONFIG ...]

Exits 0 when every run trained; otherwise 1, after the failed run's traceback."""

from __future__ import annotations

import sys
import traceback

from simpletuner.common.clean_exit import exit_process
from simpletuner.common.peer_watch import collective_timeout
from simpletuner.configuration import load_configuration
from simpletuner.train import build_accelerator
from simpletuner.training.recipe import run_training


def main(configs: list[str]) -> int:
    configurations = [load_configuration(path) for path in configs]
    # One Accelerator for the launch, as a process has one; the runs share its family (DDP's
    # find_unused_parameters comes from it) and each writes only to its own output_dir.
    accelerator = build_accelerator(configurations[0].training, collective_timeout())
    try:
        for path, configuration in zip(configs, configurations):
            print(f"[rank {accelerator.process_index}] training {path}", file=sys.stderr)
            run_training(configuration, accelerator)
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        accelerator.end_training()
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
