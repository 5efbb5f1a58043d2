"""Checkpoints: `output_dir/checkpoint-<step>/`, complete and verified, or not used.

A checkpoint is written under `.incomplete-checkpoint-<step>/`; when every rank has written its
part the main rank flushes every file, writes the manifest (manifest.py) last and renames the
folder. Only a folder whose manifest verifies is resumed from: `latest` skips one that fails,
with a warning naming the file, and takes the one before. A failed save, on any rank, removes
the staging folder and raises the same one-line error on every rank (failing_together).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simpletuner.common.atomic import atomic_write_json, fsync_directory
from simpletuner.common.together import failing_together
from simpletuner.training.checkpointing.manifest import (CheckpointError, has_manifest, naming_file,
                                           verify_checkpoint, write_manifest)
from simpletuner.training.checkpointing.sharded import load_sharded, save_sharded
from simpletuner.training.memory.sharding import is_sharded
from simpletuner.training.checkpointing.tensor_state import (capture_rng, load_optimizer, load_weights,
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
    """(step, folder) of every folder whose save completed (it has a manifest), oldest first.
    Completed is not verified: see verify_checkpoint."""
    found = []
    if output_dir.is_dir():
        for child in output_dir.iterdir():
            match = _NAME.match(child.name)
            if match and has_manifest(child):
                found.append((int(match.group(1)), child))
    return sorted(found)


def resolve_resume(value: str | None, output_dir: Path) -> Path | None:
    """'latest' -> the newest checkpoint that verifies (None when none was ever completed); a
    path must be a checkpoint that verifies. Raises CheckpointError naming the file and why."""
    if value is None:
        return None
    if value == "latest":
        return _latest_verified(output_dir)
    path = Path(value)
    if not path.is_absolute() and not path.exists():
        path = output_dir / value
    try:
        verify_checkpoint(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{path} is not a usable checkpoint: {exc}. Use 'latest' or "
                              "another checkpoint-<step> folder") from None
    return path


def _latest_verified(output_dir: Path) -> Path | None:
    checkpoints = complete_checkpoints(output_dir)
    if not checkpoints:
        logger.info("resume_from_checkpoint is 'latest' but %s has no checkpoint; "
                    "starting from step 0", output_dir)
        return None
    for _, folder in reversed(checkpoints):
        try:
            verify_checkpoint(folder)
            return folder
        except CheckpointError as exc:
            logger.warning("skipping %s: %s; trying the checkpoint before it", folder.name, exc)
    raise CheckpointError(f"resume_from_checkpoint 'latest': no checkpoint in {output_dir} "
                          "verifies (see the warnings above); restore one from a copy, name "
                          "one explicitly, or remove them to start over")


def read_trainer_state(folder: Path) -> TrainerState:
    path = folder / TRAINER_STATE
    with naming_file(path, "read"):
        return TrainerState(**json.loads(path.read_text(encoding="utf-8")))


def save_checkpoint(accelerator, output_dir: Path, state: TrainerState, *, network, optimizer,
                    sampler_state: dict[str, Any], ema=None, limit: int | None = None,
                    extra_json: dict[str, Any] | None = None,
                    resumed_from: Path | None = None, gather_full: bool = False) -> Path:
    """Every rank calls this; returns the final folder. ``network`` is the unwrapped trained
    module; ``extra_json`` maps file names to JSON-able states (e.g. the LR scheduler's);
    ``resumed_from`` (the checkpoint this run started from) is never pruned. A network sharded
    with FSDP2 is saved by sharded_checkpoint, one shard per rank unless ``gather_full``."""
    sharded = is_sharded(network)
    final = output_dir / f"checkpoint-{state.step}"
    staging = output_dir / f".incomplete-checkpoint-{state.step}"
    main, what = accelerator.is_main_process, f"checkpoint at step {state.step}"
    try:
        with failing_together(what):
            if main:
                _empty_folder(staging)
        with failing_together(what):
            _write_json(staging / rng_file(accelerator.process_index), capture_rng())
            if main and sharded:
                _write_json_parts(staging, state, sampler_state, extra_json or {})
            elif main:
                _write_main_parts(staging, state, network=network, optimizer=optimizer,
                                  sampler_state=sampler_state, ema=ema,
                                  extra_json=extra_json or {})
        if sharded:  # every rank writes its shard (collectives: DCP raises on every rank)
            with failing_together(what):
                save_sharded(staging, network=network, optimizer=optimizer, ema=ema,
                             lora=state.model_type == "lora", main=main, full=gather_full)
        with failing_together(what):
            if main:
                write_manifest(staging)
                _publish(staging, final)
    except Exception:
        if main:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if main:
        logger.info("saved %s", final)
        _prune(output_dir, limit, keep={final, resumed_from})
    return final


def _empty_folder(folder: Path) -> None:
    with naming_file(folder, "create"):
        shutil.rmtree(folder, ignore_errors=True)  # left by a save that was interrupted
        folder.mkdir(parents=True)


def _write_json(path: Path, value: Any) -> None:
    with naming_file(path, "write"):
        atomic_write_json(path, value)


def _write_main_parts(staging: Path, state: TrainerState, *, network, optimizer,
                      sampler_state: dict[str, Any], ema, extra_json: dict[str, Any]) -> None:
    save_weights(network, staging, lora=state.model_type == "lora")
    save_optimizer(optimizer, staging)
    if ema is not None:
        ema.save(staging / EMA_WEIGHTS)
    _write_json_parts(staging, state, sampler_state, extra_json)


def _write_json_parts(staging: Path, state: TrainerState, sampler_state: dict[str, Any],
                      extra_json: dict[str, Any]) -> None:
    _write_json(staging / SAMPLER_STATE, sampler_state)
    for name, value in extra_json.items():
        _write_json(staging / name, value)
    _write_json(staging / TRAINER_STATE, asdict(state))


def _publish(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``. An existing ``final`` (a step saved again) is moved
    aside first, under a name `latest` ignores, and removed after: at no moment is there no
    checkpoint of that step."""
    aside = final.with_name(f".replaced-{final.name}")
    with naming_file(final, "publish"):
        shutil.rmtree(aside, ignore_errors=True)
        if final.exists():
            final.rename(aside)
        try:
            staging.rename(final)
        except OSError:
            if aside.exists():  # put the old one back rather than leave no checkpoint
                aside.rename(final)
            raise
        fsync_directory(final.parent)
        shutil.rmtree(aside, ignore_errors=True)


def _prune(output_dir: Path, limit: int | None, keep: set[Path | None]) -> None:
    """Remove the oldest checkpoints beyond ``limit``, never one in ``keep``. A folder is
    renamed away before its files go, so none is ever left half deleted under its own name."""
    if limit is None:
        return
    kept = {path.resolve() for path in keep if path is not None}
    checkpoints = [folder for _, folder in complete_checkpoints(output_dir)]
    for folder in checkpoints[: max(0, len(checkpoints) - limit)]:
        if folder.resolve() in kept:
            continue
        doomed = folder.with_name(f".removing-{folder.name}")
        try:
            folder.rename(doomed)
            shutil.rmtree(doomed)
        except OSError as exc:  # the new checkpoint is safe; an old one lingers
            logger.warning("could not remove %s (checkpoints_total_limit=%d): %s",
                           folder, limit, exc)
            continue
        logger.info("removed %s (checkpoints_total_limit=%d)", folder, limit)


def load_checkpoint(folder: Path, *, rank: int, network, optimizer, ema=None
                    ) -> tuple[TrainerState, dict[str, Any]]:
    """Restore weights, optimizer, EMA and this rank's RNG; return trainer and sampler state.
    Every rank calls this: a file one rank cannot use stops every rank (failing_together)."""
    what = f"resuming from {folder}"
    with failing_together(what):
        trainer_state = read_trainer_state(folder)
        if not is_sharded(network):
            _load_tensor_parts(folder, trainer_state, network=network, optimizer=optimizer,
                               ema=ema)
        _restore_rank_rng(folder, rank)
        with naming_file(folder / SAMPLER_STATE, "read"):
            sampler_state = json.loads((folder / SAMPLER_STATE).read_text(encoding="utf-8"))
    if is_sharded(network):  # collectives, entered only once every rank read the rest
        with failing_together(what):
            load_sharded(folder, network=network, optimizer=optimizer, ema=ema,
                         lora=trainer_state.model_type == "lora")
    return trainer_state, sampler_state


def _load_tensor_parts(folder: Path, trainer_state: TrainerState, *, network, optimizer,
                       ema) -> None:
    load_weights(network, folder, lora=trainer_state.model_type == "lora")
    load_optimizer(optimizer, folder)
    if ema is not None:
        with naming_file(folder / EMA_WEIGHTS, "read"):
            ema.load(folder / EMA_WEIGHTS)


def _restore_rank_rng(folder: Path, rank: int) -> None:
    rng_path = folder / rng_file(rank)
    if not rng_path.is_file():  # more ranks than when saved: unsupported, the sampler warns
        logger.warning("%s has no RNG state for rank %d", folder, rank)
        return
    with naming_file(rng_path, "read"):
        restore_rng(json.loads(rng_path.read_text(encoding="utf-8")))
