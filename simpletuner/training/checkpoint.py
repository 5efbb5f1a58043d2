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


def save_checkpoint(accelerator, output_dir: Path, state: TrainerState,
                    sampler_state: dict[str, Any], ema=None, limit: int | None = None,
                    extra_json: dict[str, Any] | None = None) -> Path:
    """Every rank calls this; returns the final folder. ``extra_json`` maps file names to
    JSON-able states saved beside the accelerate state (e.g. the LR scheduler's)."""
    final = output_dir / f"checkpoint-{state.step}"
    staging = output_dir / f".incomplete-checkpoint-{state.step}"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    if accelerator.is_main_process:
        atomic_write_json(staging / SAMPLER_STATE, sampler_state)
        for name, value in (extra_json or {}).items():
            atomic_write_json(staging / name, value)
        if ema is not None:
            ema.save(staging / EMA_WEIGHTS)
        # Written last: its presence is what makes the folder a checkpoint.
        atomic_write_json(staging / TRAINER_STATE, asdict(state))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
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


def load_checkpoint(accelerator, folder: Path, ema=None) -> tuple[TrainerState, dict[str, Any]]:
    accelerator.load_state(str(folder))
    trainer_state = TrainerState(**json.loads((folder / TRAINER_STATE).read_text()))
    sampler_state = json.loads((folder / SAMPLER_STATE).read_text())
    if ema is not None:
        ema.load(folder / EMA_WEIGHTS)
    return trainer_state, sampler_state
