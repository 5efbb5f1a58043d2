"""What a killed run leaves in output_dir, removed by the next run once it holds the lock:
staging folders of checkpoints and exports, atomic writes' temporary files and the lock's
takeover guard. Each is named in the log. Files only, no torch: run by the main rank."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

# Folders: checkpoint staging (folders.py), export staging (common/atomic.staging_folder with
# the prefix ".<name>-" from pipelines.py, ".lora-" inside lora/ from lora.py).
_FOLDERS = re.compile(r"^\.(incomplete|replaced|removing)-checkpoint-\d+$|"
                      r"^\.(pipeline|lora)-.+$")
# Files: atomic writes' ".<name>.<random>.tmp", pipelines.py's ".<name>.tmp", the preflight's
# ".write-test-*", the lock's takeover guard.
_FILES = re.compile(r"^\..+\.tmp$|^\.write-test-.+$|^\.simpletuner\.lock\.takeover$")
# Folders whose own contents are looked through (the caches clean up after themselves: a walk
# through millions of cache files would cost more than it finds).
_LOOKED_THROUGH = ("", "pipeline", "lora", "validation", "logs", "trace")


def leftovers(output_dir: Path) -> list[Path]:
    """Every leftover in ``output_dir``, its export folders and its validation folders."""
    found: list[Path] = []
    for name in _LOOKED_THROUGH:
        folder = output_dir / name
        if not folder.is_dir():
            continue
        for child in folder.iterdir():
            if child.is_dir() and _FOLDERS.match(child.name):
                found.append(child)
            elif child.is_file() and _FILES.match(child.name):
                found.append(child)
        if name == "validation":
            found += [child for step in folder.iterdir() if step.is_dir()
                      for child in step.iterdir() if _FILES.match(child.name)]
    return sorted(found)


def remove_leftovers(output_dir: Path) -> list[Path]:
    """Remove what ``leftovers`` finds, logging each; returns what was removed."""
    removed = []
    for path in leftovers(Path(output_dir)):
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:  # never fatal: the run does not need the space to be right
            logger.warning("could not remove %s, left by an earlier run: %s", path, exc)
            continue
        removed.append(path)
        logger.info("removed %s, left by an earlier run that was stopped", path)
    return removed
