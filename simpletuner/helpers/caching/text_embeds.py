"""Text-embedding cache: one safetensors file per unique caption, named by a digest of the text
encoders' identity and the caption, holding every named tensor ``encode_prompts`` returns (one
row, batch dimension removed). Same static partition, atomic writes and warm start as latents.
A family whose text encoder also reads the reference images (Qwen-Image-Edit) keys each entry by
the caption and its references' latent entries (reference_prompts.py)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from simpletuner.helpers.caching.storage import (
    CACHE_FORMAT, digest, entry_path, load_entry, rank_share, save_entry,
)

EncodePrompts = Callable[[list[str]], dict[str, torch.Tensor]]  # ModelAdapter.encode_prompts


def default_text_dir(dataset, output_dir: str | Path) -> Path:
    """``cache_dir`` of a configuration.DatasetConfig if set, else ``<output_dir>/cache/text``:
    entries are keyed by caption, so datasets can share one folder."""
    return Path(dataset.cache_dir or Path(output_dir) / "cache" / "text")


def stack_padded(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack rows; rows of different lengths (variable-length embeddings such as Qwen-Image's,
    cached with their masks) are first zero-padded at the end of their first dimension, as the
    pipelines pad a batch: padded positions have mask 0 and are not attended to."""
    if all(row.shape == rows[0].shape for row in rows):
        return torch.stack(rows)
    longest = max(row.shape[0] for row in rows)
    return torch.stack([torch.nn.functional.pad(row, (0, 0) * (row.dim() - 1)
                                                + (0, longest - row.shape[0]))
                        for row in rows])


@dataclass
class TextEmbedCache:
    folder: Path
    model_identity: str            # storage.model_identity of the text encoders (and family)
    keep_in_memory: int = 64       # captions repeat across batches (SDXL row: ~0.6 MB)
    _recent: OrderedDict = field(default_factory=OrderedDict, init=False, repr=False)

    def path_for(self, caption: str, references: tuple[str, ...] = ()) -> Path:
        """``references``: the keys of the latent entries of the references the text encoder
        reads with the caption; none for families whose prompts are text only."""
        payload = {"format": CACHE_FORMAT, "kind": "text", "model": self.model_identity,
                   "caption": caption}
        if references:  # only then, so text-only entries keep their names
            payload["references"] = list(references)
        return entry_path(self.folder, digest(payload))

    def load(self, captions: Sequence[str],
             references: Sequence[tuple[str, ...]] | None = None) -> dict[str, torch.Tensor]:
        """Named tensors stacked over ``captions`` (each with its ``references``, if given):
        each [len(captions), ...]."""
        keys = references if references is not None else [()] * len(captions)
        rows = [self._row(caption, refs) for caption, refs in zip(captions, keys, strict=True)]
        return {name: stack_padded([row[name] for row in rows]) for name in rows[0]}

    def _row(self, caption: str, references: tuple[str, ...]) -> dict[str, torch.Tensor]:
        row = self._recent.get((caption, references))
        if row is not None:
            self._recent.move_to_end((caption, references))
            return row
        path = self.path_for(caption, references)
        try:
            row = load_entry(path, f"text embedding of {caption!r}")
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"no cached text embedding for caption {caption!r} in {self.folder}; the cache "
                "folder must be on storage every rank can read") from error
        self._recent[(caption, references)] = row
        if len(self._recent) > self.keep_in_memory:
            self._recent.popitem(last=False)
        return row


def cache_text_embeds(captions: Iterable[str], cache: TextEmbedCache,
                      encode_prompts: EncodePrompts, *, rank: int = 0, world_size: int = 1,
                      batch_size: int = 16, progress: bool = True) -> int:
    """Encode the missing captions of this rank's share of the unique captions; returns how
    many entries this rank wrote. Call on every rank, then synchronise before reading."""
    share = rank_share(sorted(set(captions)), rank, world_size)
    todo = [c for c in share if not cache.path_for(c).exists()]
    with tqdm(total=len(todo), desc=f"caching text embeddings [{cache.folder.name}]",
              unit="caption", disable=not progress or not todo) as bar:
        for start in range(0, len(todo), batch_size):
            batch = todo[start:start + batch_size]
            with torch.no_grad():
                embeds = encode_prompts(batch)
            embeds = {name: t.detach().to("cpu", torch.float32) for name, t in embeds.items()}
            for row, caption in enumerate(batch):
                save_entry(cache.path_for(caption),
                           {name: t[row] for name, t in embeds.items()})
            bar.update(len(batch))
    return len(todo)
