"""Checkpoints: `output_dir/checkpoint-<step>/`, complete and verified, or not used.

The checkpointer owns every file a checkpoint holds: the run state, the trained weights (or the
LoRA adapter), the optimizer, the EMA, the sampler position, the LR schedule, each rank's RNG
and the manifest. A checkpoint is written under `.incomplete-checkpoint-<step>/`; when every
rank has written its part the main rank flushes every file, writes the manifest (manifest.py)
last and renames the folder (folders.py). Only a folder whose manifest verifies is resumed
from. A failed save, on any rank, removes the staging folder and raises the same one-line error
on every rank (failing_together). A network sharded with FSDP2 is saved by sharded.py: one
shard per rank, or the gathered whole with ``gather_full``.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from simpletuner.common.atomic import atomic_write_json
from simpletuner.common.together import failing_together
from simpletuner.training.checkpointing.folders import (empty_folder, final_folder, prune,
                                                        publish, staging_folder)
from simpletuner.training.checkpointing.manifest import naming_file, write_manifest
from simpletuner.training.checkpointing.sharded import load_sharded, save_sharded
from simpletuner.training.checkpointing.tensor_state import (capture_rng, load_optimizer,
                                                             load_weights, restore_rng,
                                                             rng_file, save_optimizer,
                                                             save_weights)
from simpletuner.training.memory.sharding import is_sharded
from simpletuner.training.run_state import RunState

logger = logging.getLogger(__name__)

RUN_STATE = "trainer_state.json"
SAMPLER_STATE = "sampler_state.json"
LR_SCHEDULER_STATE = "lr_scheduler.json"
EMA_WEIGHTS = "ema.safetensors"


@dataclass
class TrainedParts:
    """What a checkpoint saves beside the run state. ``network`` is the unwrapped trained
    module (FSDP2 shards included); ``lr_scheduler`` and ``sampler`` have JSON-able
    ``state_dict()`` / ``load_state_dict()``."""

    network: torch.nn.Module
    optimizer: Any
    lr_scheduler: Any
    sampler: Any
    ema: Any = None


def read_run_state(folder: Path) -> RunState:
    path = folder / RUN_STATE
    with naming_file(path, "read"):
        return RunState(**json.loads(path.read_text(encoding="utf-8")))


def _read_json(path: Path) -> Any:
    with naming_file(path, "read"):
        return json.loads(path.read_text(encoding="utf-8"))


def plain_numbers(value: Any) -> Any:
    """``value`` with tensors as numbers (lists for larger ones): torchao's optimizers keep the
    learning rate as a tensor, so the LR schedule's state holds tensors."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, dict):
        return {key: plain_numbers(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_numbers(item) for item in value]
    return value


def _write_json(path: Path, value: Any) -> None:
    with naming_file(path, "write"):
        atomic_write_json(path, value)


class Checkpointer:
    """Every rank holds one and calls ``save`` and ``load`` at the same points.
    ``resumed_from`` (the checkpoint this run started from) is never pruned."""

    def __init__(self, accelerator, output_dir: Path, *, limit: int | None = None,
                 gather_full: bool = False, resumed_from: Path | None = None):
        self.accelerator = accelerator
        self.output_dir = Path(output_dir)
        self.limit, self.gather_full, self.resumed_from = limit, gather_full, resumed_from

    def save(self, state: RunState, parts: TrainedParts) -> Path:
        """Write ``checkpoint-<state.step>/`` and return it; logs the folder once."""
        main = self.accelerator.is_main_process
        final = final_folder(self.output_dir, state.step)
        staging = staging_folder(self.output_dir, state.step)
        what = f"checkpoint at step {state.step}"
        try:
            with failing_together(what):
                if main:
                    empty_folder(staging)
            with failing_together(what):
                self._write_parts(staging, state, parts)
            if is_sharded(parts.network):  # every rank writes its shard (DCP's collectives)
                with failing_together(what):
                    save_sharded(staging, network=parts.network, optimizer=parts.optimizer,
                                 ema=parts.ema, lora=state.model_type == "lora", main=main,
                                 full=self.gather_full)
            with failing_together(what):
                if main:
                    write_manifest(staging)
                    publish(staging, final)
        except Exception:
            if main:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        if main:
            logger.info("saved %s", final)
            prune(self.output_dir, self.limit, keep={final, self.resumed_from})
        return final

    def _write_parts(self, staging: Path, state: RunState, parts: TrainedParts) -> None:
        """This rank's RNG; on the main rank the JSON parts and, unsharded, the tensors."""
        _write_json(staging / rng_file(self.accelerator.process_index), capture_rng())
        if not self.accelerator.is_main_process:
            return
        if not is_sharded(parts.network):
            save_weights(parts.network, staging, lora=state.model_type == "lora")
            save_optimizer(parts.optimizer, staging)
            if parts.ema is not None:
                parts.ema.save(staging / EMA_WEIGHTS)
        _write_json(staging / SAMPLER_STATE, parts.sampler.state_dict())
        _write_json(staging / LR_SCHEDULER_STATE, plain_numbers(parts.lr_scheduler.state_dict()))
        _write_json(staging / RUN_STATE, asdict(state))

    def load(self, folder: Path, parts: TrainedParts) -> RunState:
        """Restore every part and this rank's RNG from ``folder``; return the run state. A file
        one rank cannot use stops every rank (failing_together)."""
        what = f"resuming from {folder}"
        sharded = is_sharded(parts.network)
        with failing_together(what):
            state = read_run_state(folder)
            if not sharded:
                self._load_tensor_parts(folder, state, parts)
            self._restore_rank_rng(folder)
            parts.sampler.load_state_dict(_read_json(folder / SAMPLER_STATE))
            parts.lr_scheduler.load_state_dict(_read_json(folder / LR_SCHEDULER_STATE))
        if sharded:  # collectives, entered only once every rank read the rest
            with failing_together(what):
                load_sharded(folder, network=parts.network, optimizer=parts.optimizer,
                             ema=parts.ema, lora=state.model_type == "lora")
        return state

    @staticmethod
    def _load_tensor_parts(folder: Path, state: RunState, parts: TrainedParts) -> None:
        load_weights(parts.network, folder, lora=state.model_type == "lora")
        load_optimizer(parts.optimizer, folder)
        if parts.ema is not None:
            with naming_file(folder / EMA_WEIGHTS, "read"):
                parts.ema.load(folder / EMA_WEIGHTS)

    def _restore_rank_rng(self, folder: Path) -> None:
        rank = self.accelerator.process_index
        rng_path = folder / rng_file(rank)
        if not rng_path.is_file():  # more ranks than when saved: unsupported, the sampler warns
            logger.warning("%s has no RNG state for rank %d", folder, rank)
            return
        restore_rng(_read_json(rng_path))
