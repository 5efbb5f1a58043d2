"""Checkpoints: `output_dir/checkpoint-<step>/`, complete or absent.

A checkpoint is written under a temporary name and renamed only when every rank has written
its part, so an interrupted save is never taken for a checkpoint by `latest`.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simpletuner.helpers.data_backend.atomic import atomic_write_json
from simpletuner.training.train_state import (capture_rng, load_optimizer, load_weights,
                                              restore_rng, rng_file, save_optimizer, save_weights)

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
SAMPLER_STATE = "sampler_state.json"
EMA_WEIGHTS = "ema.safetensors"


@dataclass
class TrainerState:
    step: int            # optimizer steps completed
    epoch: int
    seed: int            # the resolved shared seed, so the run can be reproduced
    fingerprint: dict[str, Any]
    model_type: str      # "full" or "lora": resuming one into the other is refused


def complete_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first."""
    found = []
    if output_dir.is_dir():
        for child in output_dir.iterdir():
            match = _NAME.match(child.name)
            if match and (child / TRAINER_STATE).is_file():
                found.append((int(match.group(1)), child))
    return sorted(found)


def resolve_resume(value: str | None, output_dir: Path) -> Path | None:
    """'latest' -> newest complete checkpoint (None when there is none); a path must be one."""
    if value is None:
        return None
    if value == "latest":
        checkpoints = complete_checkpoints(output_dir)
        if not checkpoints:
            logger.info("resume_from_checkpoint is 'latest' but %s has no checkpoint; "
                        "starting from step 0", output_dir)
            return None
        return checkpoints[-1][1]
    path = Path(value)
    if not path.is_absolute() and not path.exists():
        path = output_dir / value
    if not (path / TRAINER_STATE).is_file():
        raise ValueError(f"resume_from_checkpoint: {path} is not a complete checkpoint "
                         f"(no {TRAINER_STATE}); use 'latest' or a checkpoint-<step> folder")
    return path


def save_checkpoint(accelerator, output_dir: Path, state: TrainerState, *, network, optimizer,
                    sampler_state: dict[str, Any], ema=None, limit: int | None = None,
                    extra_json: dict[str, Any] | None = None) -> Path:
    """Every rank calls this; returns the final folder. ``network`` is the unwrapped trained
    module; ``extra_json`` maps file names to JSON-able states (e.g. the LR scheduler's)."""
    final = output_dir / f"checkpoint-{state.step}"
    staging = output_dir / f".incomplete-checkpoint-{state.step}"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    atomic_write_json(staging / rng_file(accelerator.process_index), capture_rng())
    if accelerator.is_main_process:
        save_weights(network, staging, lora=state.model_type == "lora")
        save_optimizer(optimizer, staging)
        atomic_write_json(staging / SAMPLER_STATE, sampler_state)
        for name, value in (extra_json or {}).items():
            atomic_write_json(staging / name, value)
        if ema is not None:
            ema.save(staging / EMA_WEIGHTS)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        # Written last, after every rank's part: its presence makes the folder a checkpoint.
        atomic_write_json(staging / TRAINER_STATE, asdict(state))
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        _prune(output_dir, limit)
        logger.info("saved %s", final)
    accelerator.wait_for_everyone()
    return final


def _prune(output_dir: Path, limit: int | None) -> None:
    if limit is None:
        return
    checkpoints = complete_checkpoints(output_dir)
    for _, folder in checkpoints[: max(0, len(checkpoints) - limit)]:
        shutil.rmtree(folder)
        logger.info("removed %s (checkpoints_total_limit=%d)", folder, limit)


def load_checkpoint(folder: Path, *, rank: int, network, optimizer, ema=None
                    ) -> tuple[TrainerState, dict[str, Any]]:
    """Restore weights, optimizer, EMA and this rank's RNG; return trainer and sampler state."""
    trainer_state = TrainerState(**json.loads((folder / TRAINER_STATE).read_text()))
    load_weights(network, folder, lora=trainer_state.model_type == "lora")
    load_optimizer(optimizer, folder)
    if ema is not None:
        ema.load(folder / EMA_WEIGHTS)
    rng_path = folder / rng_file(rank)
    if rng_path.is_file():
        restore_rng(json.loads(rng_path.read_text()))
    else:  # more ranks than when saved: unsupported, and the sampler's warning names it
        logger.warning("%s has no RNG state for rank %d", folder, rank)
    sampler_state = json.loads((folder / SAMPLER_STATE).read_text())
    return trainer_state, sampler_state
