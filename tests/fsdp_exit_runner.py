"""Shards a small network with FSDP2, trains one step, saves a sharded checkpoint through the
real Checkpointer, ends the process group and exits as the trainer does
(common/clean_exit.py), or, with ``--bare``, through the interpreter's finalization (the exit
that aborted).

    torchrun --standalone --nproc_per_node 2 fsdp_exit_runner.py OUT [--bare]"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator

from simpletuner.common.clean_exit import exit_process
from simpletuner.training.checkpointing.checkpointer import Checkpointer
from simpletuner.training.run_state import RunState
from checkpoint_parts import parts_for
from simpletuner.training.run.outcomes import EXIT_TRAINED
from simpletuner.training.memory.sharding import shard_network
from simpletuner.training.settings import ShardingSettings
from settings_fixtures import settings

SETTINGS = settings(ShardingSettings, fsdp_enable=True)


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def main() -> int:
    out, bare = Path(sys.argv[1]), "--bare" in sys.argv
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    network = Blocks()
    shard_network(network, SETTINGS, "cpu")
    optimizer = torch.optim.AdamW(network.parameters())
    network(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    state = RunState(step=1, epoch=0, seed=1, fingerprint={}, model_type="full")
    Checkpointer(accelerator, out).save(state, parts_for(network, optimizer, epoch=0, step=1))
    accelerator.end_training()
    if not bare:
        exit_process(EXIT_TRAINED)
    return EXIT_TRAINED


if __name__ == "__main__":
    sys.exit(main())
