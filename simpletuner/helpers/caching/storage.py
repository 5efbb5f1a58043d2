"""What both caches share: content-addressed file names, atomic safetensors writes, the static
split of cache work over ranks, and a fingerprint of the model components that produce entries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from simpletuner.common.atomic import atomic_write_bytes
from simpletuner.common.names import name_bytes

T = TypeVar("T")

CACHE_FORMAT = 1  # bump when the layout or contents of an entry change


def digest(payload: object) -> str:
    """sha256 of canonical JSON: stable across processes, machines and PYTHONHASHSEED."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(name_bytes(text)).hexdigest()  # ids that are not UTF-8: their bytes


def entry_path(folder: Path, key: str) -> Path:
    """Two-level layout so a million entries never sit in one directory."""
    return folder / key[:2] / f"{key}.safetensors"


def rank_share(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """This rank's part of the cache work: every ``world_size``-th item of the sorted list.
    Pure, and computed from the full list so ranks agree even while others are writing."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    return list(sorted(items)[rank::world_size])


class CacheEntryError(RuntimeError):
    """A cache entry that exists but cannot be read: names the file and how to rebuild it."""


def load_entry(path: Path, what: str) -> dict[str, torch.Tensor]:
    """Read one entry; a damaged file (interrupted copy, full disk) gets a clear error."""
    try:
        return load_file(path)
    except SafetensorError as error:
        raise CacheEntryError(
            f"the cached {what} in {path} is damaged ({error}); delete that file (or its "
            "cache folder) and rerun to encode it again") from error


def save_entry(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Atomic: a reader (or a crash) never sees a half-written entry."""
    atomic_write_bytes(path, save({k: v.contiguous() for k, v in tensors.items()}))


def model_identity(folder: str | Path, components: Sequence[str], family: str) -> str:
    """Fingerprint of the components (sub-folders of a diffusers model folder) that produce
    cache entries: their JSON configs by content, their weight files by size and mtime, so a
    different or retrained VAE / text encoder never reuses old entries."""
    root = Path(folder).resolve()
    described: dict[str, object] = {"family": family, "folder": str(root)}
    for component in components:
        base = root / component
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        entries = []
        for file in files:
            relative = file.relative_to(root).as_posix()
            if file.suffix in (".json", ".txt", ".model"):
                entries.append([relative, hashlib.sha256(file.read_bytes()).hexdigest()])
            else:
                stat = file.stat()
                entries.append([relative, stat.st_size, stat.st_mtime_ns])
        described[component] = entries
    return digest(described)
