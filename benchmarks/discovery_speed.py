"""Discovery speed: header reads vs decoding every image, and a second (cached) run.

    python benchmarks/discovery_speed.py [--images 2000] [--folder DIR] [--decode-sample 200]

Generates JPEG/PNG photo-sized images (or uses the images in --folder), then times
MetadataBackend.refresh_index on a cold cache, again on the warm cache, and a full decode of a
sample of the images (extrapolated to all). Prints per-image figures.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from PIL import Image

from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.helpers.metadata.backends.base import MetadataBackend

SHAPES = [(1024, 768), (768, 1024), (1200, 800), (800, 1200), (1024, 1024), (1600, 900), (640, 480)]


def generate(folder: Path, count: int) -> None:
    rng = random.Random(0)
    templates = {s: Image.effect_noise(s, 30).convert("RGB") for s in SHAPES}
    for i in range(count):
        shape = rng.choice(SHAPES)
        ext = ".png" if i % 50 == 0 else ".jpg"
        path = folder / f"part{i % 20:02d}" / f"img{i:06d}{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        templates[shape].save(path, quality=90)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--decode-sample", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder or Path(tmp) / "images"
        if args.folder is None:
            started = time.perf_counter()
            generate(folder, args.images)
            print(f"generated {args.images} images in {time.perf_counter() - started:.1f} s")
        training = TrainingConfig(model_family="sd1x", pretrained_model_name_or_path="none",
                                  output_dir=str(Path(tmp) / "out"), data_backend_config="none",
                                  resolution=1024)
        backend = MetadataBackend.from_config(
            DatasetConfig(id="bench", instance_data_dir=str(folder), caption_strategy="filename"),
            training)

        started = time.perf_counter()
        index = backend.refresh_index(show_progress=False)
        cold = time.perf_counter() - started
        count = backend.last_refresh.listed
        started = time.perf_counter()
        backend.refresh_index(show_progress=False)
        warm = time.perf_counter() - started
        assert backend.last_refresh.read == 0

        sample = sorted(index.original_sizes)[: args.decode_sample]
        started = time.perf_counter()
        for sample_id in sample:
            with Image.open(backend.data_backend.path(sample_id)) as im:
                im.load()
        decode_each = (time.perf_counter() - started) / max(1, len(sample))

        print(f"{count} images, {index.sample_count} indexed in {len(index.buckets)} buckets")
        print(f"discovery, cold cache : {cold:7.2f} s  ({cold / count * 1e6:7.0f} us/image)")
        print(f"discovery, warm cache : {warm:7.2f} s  ({warm / count * 1e6:7.0f} us/image, "
              "0 headers read)")
        decode_all = decode_each * count
        print(f"full decode (single thread, {len(sample)} sampled): {decode_each * 1e6:7.0f} "
              f"us/image -> {decode_all:.1f} s for all; headers are {decode_all / cold:.0f}x faster")


if __name__ == "__main__":
    main()
