"""Shards a small network with FSDP2, trains one step, saves a sharded checkpoint through the
real save_checkpoint, ends the process group and exits as the trainer does
(common/clean_exit.py), or, with ``--bare``, through the interpreter's finalization (the exit
that aborted).

    torchrun --standalone --nproc_per_node 2 fsdp_exit_runner.py OUT [--bare]"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from accelerate import Accelerator

from simpletuner.common.clean_exit import exit_process
from simpletuner.training.checkpointing.checkpoint import TrainerState, save_checkpoint
from simpletuner.training.run.outcomes import EXIT_TRAINED
from simpletuner.training.memory.sharding import shard_network

SETTINGS = SimpleNamespace(fsdp_transformer_layer_cls_to_wrap=None, fsdp_sharding="full",
                           fsdp_reshard_after_forward=True, mixed_precision="no",
                           optimizer="adamw")


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
    state = TrainerState(step=1, epoch=0, seed=1, fingerprint={}, model_type="full")
    save_checkpoint(accelerator, out, state, network=network, optimizer=optimizer,
                    sampler_state={"epoch": 0, "step": 1})
    accelerator.end_training()
    if not bare:
        exit_process(EXIT_TRAINED)
    return EXIT_TRAINED


if __name__ == "__main__":
    sys.exit(main())
