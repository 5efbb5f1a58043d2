"""``accelerate launch``, without the launcher's own traceback when a training process fails.

Each training process prints its one-line message and leaves its status for train.sh
(training/run/outcomes.py); accelerate then raises CalledProcessError (one process) or torch's
ChildFailedError (several), whose traceback after that line says nothing more and reads as a
crash of the trainer. Used by train.sh as ``python -m simpletuner.launch [--cpu-without-cuda] <accelerate launch
arguments>``: with ``--cpu-without-cuda`` a machine without CUDA launches CPU processes (gloo),
decided here, where torch is imported anyway, instead of by an interpreter of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from accelerate.commands.launch import launch_command, launch_command_parser
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


def shell_status(exitcode: int) -> int:
    """A process's exit code as a shell reports it: killed by signal N (-N here) is 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode


CPU_WITHOUT_CUDA = "--cpu-without-cuda"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CPU_WITHOUT_CUDA]:
        argv = argv[1:]
        if not torch.cuda.is_available():
            # accelerate's '--cpu --num_processes N' silently starts one process; CPU runs of
            # several processes need '--multi_gpu' with this variable (gloo).
            os.environ["ACCELERATE_USE_CPU"] = "true"
    args = launch_command_parser().parse_args(argv)
    try:
        launch_command(args)
    except subprocess.CalledProcessError as failed:
        return shell_status(failed.returncode)
    except ChildFailedError as failed:
        _, first = failed.get_first_failure()
        return shell_status(first.exitcode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
