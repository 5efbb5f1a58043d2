"""How long BatchAssembler takes per micro-batch, read from real cache files (issue 6 wants data
waiting under 5% of step time). Run: python benchmarks/bench_batch_assembly.py"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from simpletuner.helpers.caching.latents import LatentCache
from simpletuner.helpers.caching.storage import entry_path, save_entry
from simpletuner.helpers.caching.text_embeds import TextEmbedCache
from simpletuner.helpers.multiaspect.batch import BatchSample, MicroBatch
from simpletuner.helpers.multiaspect.dataset import BatchAssembler

# name: (latent shape, {embedding name: shape}, batch size)
CASES = {
    "tiny-sd1x 64px": ((4, 8, 8), {"prompt_embeds": (77, 32)}, 4),
    "sdxl 1024px": ((4, 128, 128), {"prompt_embeds": (77, 2048), "pooled_prompt_embeds": (1280,)},
                    4),
}
SAMPLES = 64


def build(folder: Path, latent_shape, embed_shapes, keep_in_memory: int) -> BatchAssembler:
    latents = LatentCache(folder / "vae")
    text = TextEmbedCache(folder / "text", "te", keep_in_memory=keep_in_memory)
    for i in range(SAMPLES):
        path = entry_path(latents.folder, f"{i:064x}")
        save_entry(path, {"latent": torch.randn(latent_shape),
                          "geometry": torch.tensor([64, 64, 0, 0, 64, 64])})
        latents.paths[f"{i}.png"] = path
    for c in range(8):  # captions repeat, as with instance prompts or a few class captions
        save_entry(text.path_for(f"caption {c}"),
                   {name: torch.randn(shape) for name, shape in embed_shapes.items()})
    return BatchAssembler({"d": latents}, {"d": text})


def main() -> None:
    for name, (latent_shape, embed_shapes, batch) in CASES.items():
        for keep in (0, 64):
            with tempfile.TemporaryDirectory() as tmp:
                assembler = build(Path(tmp), latent_shape, embed_shapes, keep)
                batches = [MicroBatch(0, s, "d", "64x64", tuple(
                    BatchSample("d", f"{(s * batch + k) % SAMPLES}.png", "64x64", (64, 64),
                                f"caption {(s + k) % 8}") for k in range(batch)))
                    for s in range(200)]
                assembler(batches[0])  # warm the page cache like a running epoch would
                start = time.perf_counter()
                for mb in batches:
                    assembler(mb)
                per_batch = (time.perf_counter() - start) / len(batches) * 1e3
                print(f"{name:16s} batch {batch} text LRU {keep:3d}: {per_batch:.3f} ms/batch")


if __name__ == "__main__":
    main()
