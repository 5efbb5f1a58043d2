"""Saves two checkpoints of a small model through the real Checkpointer, the second with a
real write fault on one rank: that rank's files may grow to at most FSIZE_LIMIT bytes
(RLIMIT_FSIZE with SIGXFSZ ignored, so an oversized write fails with EFBIG).

    [torchrun --standalone --nproc_per_node N] checkpoint_fault_runner.py OUT FAULT_RANK LIMIT

Each rank prints one line, "[rank k] saved <folder>" or "[rank k] failed: <error>", and
exits 0 or 1."""

from __future__ import annotations

import resource
import signal
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

from simpletuner.training.checkpointing.checkpointer import Checkpointer
from simpletuner.training.run_state import RunState
from checkpoint_parts import parts_for


def save(accelerator: Accelerator, out: Path, step: int, network, optimizer) -> Path:
    state = RunState(step=step, epoch=0, seed=1, fingerprint={}, model_type="full")
    return Checkpointer(accelerator, out).save(state, parts_for(network, optimizer, epoch=0,
                                                                step=step))


def main() -> int:
    out, fault_rank, limit = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    network = torch.nn.Linear(256, 256)  # 257 KB of weights: over any small limit
    optimizer = torch.optim.AdamW(network.parameters())
    network(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    try:
        save(accelerator, out, 2, network, optimizer)
        if rank == fault_rank:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        folder = save(accelerator, out, 4, network, optimizer)
        print(f"[rank {rank}] saved {folder}", flush=True)
        return 0
    except Exception as exc:
        print(f"[rank {rank}] failed: {exc}", flush=True)
        return 1
    finally:
        # Every rank's line is out before any exits: torchrun ends the others when one exits 1.
        accelerator.wait_for_everyone()
        accelerator.end_training()


if __name__ == "__main__":
    sys.exit(main())
