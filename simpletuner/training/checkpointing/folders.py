"""Checkpoint folders in output_dir: which are complete, which one to resume from, publishing a
staged one under its final name, pruning old ones. Files only, no collective."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from simpletuner.common.atomic import fsync_directory
from simpletuner.training.checkpointing.manifest import (CheckpointError, has_manifest,
                                                         naming_file, verify_checkpoint)

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d+)$")


def final_folder(output_dir: Path, step: int) -> Path:
    return output_dir / f"checkpoint-{step}"


def staging_folder(output_dir: Path, step: int) -> Path:
    return output_dir / f".incomplete-checkpoint-{step}"


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


def empty_folder(folder: Path) -> None:
    with naming_file(folder, "create"):
        shutil.rmtree(folder, ignore_errors=True)  # left by a save that was interrupted
        folder.mkdir(parents=True)


def publish(staging: Path, final: Path) -> None:
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


def prune(output_dir: Path, limit: int | None, keep: set[Path | None]) -> None:
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
