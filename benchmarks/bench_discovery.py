"""Discovery: the project's header-only discovery against the practical limit and the old way.

    python benchmarks/bench_discovery.py [--images 10000] [--tiny] [--decode-limit 3000] [--json]

Generates N images of mixed sizes and formats once (JPEG, PNG, WebP, photo-sized unless --tiny;
kept under $SIMPLETUNER_CACHE/benchmarks, or use --folder), then measures in one run:

* cold discovery through the project: MetadataBackend.refresh_index with an empty metadata cache
  (list, read headers, bucket, write the cache);
* warm start, nothing changed: refresh_index on the main rank plus load_index on another rank;
* a bare header-read loop (os.walk + Image.open().size, one thread): the practical limit;
* a decode-every-image loop (os.walk + Image.open().load(), one thread): the old way. With
  --decode-limit it decodes an even sample and extrapolates (said so in the output).

Every file is read once right before each pass, so each pass starts with the images in the OS
page cache (memory is reclaimed between passes on some machines; this VM's kdamond does).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from benchlib import (data_folder, emit, format_table, machine, parse_with_smoke, ratio,
                      verdict)
from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.helpers.data_backend.local import IMAGE_EXTENSIONS
from simpletuner.helpers.metadata.backends.base import MetadataBackend

PHOTO_SHAPES = [(1024, 768), (768, 1024), (1024, 1024), (1216, 832), (832, 1216), (1344, 768),
                (768, 1344), (640, 480), (512, 512), (1536, 1024)]
TINY_SHAPES = [(8, 8), (16, 12), (12, 16), (32, 32), (48, 32), (32, 48), (64, 64), (64, 40)]
FORMATS = [("JPEG", ".jpg", 80), ("PNG", ".png", 12), ("WEBP", ".webp", 8)]  # weight in %
GENERATOR_VERSION = 1
COMPLETE_MARKER = ".complete"  # hidden, so discovery ignores it


def _encode(shape: tuple[int, int], image_format: str) -> bytes:
    # Smooth gradients keep files small (about 4-30 KB at 1 MP) while decoding costs what a
    # photo of that size costs.
    width, height = shape
    ramp = Image.linear_gradient("L").resize((width, height))
    picture = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
                                  ramp.transpose(Image.Transpose.ROTATE_180)))
    out = io.BytesIO()
    picture.save(out, image_format, **({"quality": 85} if image_format != "PNG" else {}))
    return out.getvalue()


def ensure_images(count: int, tiny: bool) -> Path:
    """The generated folder for (count, tiny), made once and reused by later runs."""
    folder = data_folder(f"discovery-v{GENERATOR_VERSION}-{'tiny' if tiny else 'photo'}-{count}")
    if (folder / COMPLETE_MARKER).exists():
        return folder
    shapes = TINY_SHAPES if tiny else PHOTO_SHAPES
    templates = {(s, ext): _encode(s, fmt) for s in shapes for fmt, ext, _ in FORMATS}
    rng = random.Random(0)
    exts = rng.choices([ext for _, ext, _ in FORMATS], [w for *_, w in FORMATS], k=count)
    for i in tqdm(range(count), desc=f"generating {count} images in {folder}", unit="img",
                  file=sys.stderr):
        path = folder / f"part{i // 1000:04d}" / f"img{i:07d}{exts[i]}"
        if i % 1000 == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(templates[(rng.choice(shapes), exts[i])])
    (folder / COMPLETE_MARKER).write_text("done\n")
    return folder


def image_paths(root: Path) -> list[str]:
    """What a bare loop would discover: image files by extension, hidden entries ignored."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(folder, name) for name in sorted(files)
                     if not name.startswith(".")
                     and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS)
    return found


def warm_page_cache(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as handle:
            total += len(handle.read())
    return total


def header_loop(root: Path) -> tuple[float, int]:
    start = time.perf_counter()
    paths = image_paths(root)
    for path in paths:
        with Image.open(path) as im:
            im.size  # noqa: B018 - the header parse is the work measured
    return time.perf_counter() - start, len(paths)


def decode_loop(root: Path, limit: int) -> tuple[float, int, int]:
    """(seconds for every image, images decoded, images listed); extrapolated past ``limit``."""
    start = time.perf_counter()
    paths = image_paths(root)
    listed_s = time.perf_counter() - start
    sample = paths if not limit or limit >= len(paths) else paths[::len(paths) // limit][:limit]
    start = time.perf_counter()
    for path in sample:
        with Image.open(path) as im:
            im.load()
    decode_s = time.perf_counter() - start
    return listed_s + decode_s * len(paths) / max(1, len(sample)), len(sample), len(paths)


def backend_for(root: Path, output_dir: Path) -> MetadataBackend:
    training = TrainingConfig(model_family="sd1x", pretrained_model_name_or_path="none",
                              output_dir=str(output_dir), data_backend_config="none",
                              resolution=1024)
    dataset = DatasetConfig(id="bench", instance_data_dir=str(root), caption_strategy="filename")
    return MetadataBackend.from_config(dataset, training)


def timed(call):
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def measure(root: Path, decode_limit: int, repeats: int) -> dict:
    paths = image_paths(root)
    print("each pass after reading every file once (OS page cache)...", file=sys.stderr)
    warm_bytes = warm_page_cache(paths)
    header_s, count = header_loop(root)
    with tempfile.TemporaryDirectory() as out:
        output_dir = Path(out)
        warm_page_cache(paths)
        cold_s, index = timed(lambda: backend_for(root, output_dir).refresh_index(
            show_progress=False))
        warm, load = [], []
        for _ in range(repeats):  # a fresh backend each time: nothing kept in memory
            backend = backend_for(root, output_dir)
            seconds, _ = timed(lambda: backend.refresh_index(show_progress=False))
            if backend.last_refresh.read or backend.last_refresh.cache_written:
                raise RuntimeError(f"warm refresh was not warm: {backend.last_refresh}")
            warm.append(seconds)
            load.append(timed(backend_for(root, output_dir).load_index)[0])
        cache_mb = backend.cache_path.stat().st_size / 2**20
    warm_page_cache(paths)
    decode_s, decoded, _ = decode_loop(root, decode_limit)
    warm_s, load_s = statistics.median(warm), statistics.median(load)
    result = {
        "images": count, "indexed": index.sample_count, "skipped": len(index.skipped),
        "buckets": len(index.buckets), "data_mb": round(warm_bytes / 2**20, 1),
        "metadata_cache_mb": round(cache_mb, 1),
        "cold_discovery_s": round(cold_s, 3), "warm_discovery_s": round(warm_s, 3),
        "warm_load_index_s": round(load_s, 3), "warm_start_s": round(warm_s + load_s, 3),
        "header_loop_s": round(header_s, 3), "decode_loop_s": round(decode_s, 3),
        "decode_loop_images_decoded": decoded, "decode_loop_extrapolated": decoded < count,
        "decode_over_cold": ratio(decode_s, cold_s), "cold_over_header": ratio(cold_s, header_s),
    }
    for key in ("cold_discovery", "warm_discovery", "header_loop", "decode_loop"):
        result[f"{key}_images_per_s"] = round(count / result[f"{key}_s"]) if count else None
    result["targets"] = {
        "cold at least 10x faster than decoding": result["decode_over_cold"] >= 10,
        "cold within 2x of the bare header loop": result["cold_over_header"] <= 2,
        "warm start under 2 s (at 100 000 images)": result["warm_start_s"] < 2,
    }
    return result


def render(result: dict) -> str:
    n = result["images"]
    rows = [
        ["decode every image (old way)", result["decode_loop_s"],
         result["decode_loop_images_per_s"], result["decode_over_cold"]],
        ["bare header-read loop (limit)", result["header_loop_s"],
         result["header_loop_images_per_s"], ratio(result["header_loop_s"],
                                                   result["cold_discovery_s"])],
        ["project discovery, cold", result["cold_discovery_s"],
         result["cold_discovery_images_per_s"], 1.0],
        ["project discovery, warm (main rank)", result["warm_discovery_s"],
         result["warm_discovery_images_per_s"], ratio(result["warm_discovery_s"],
                                                      result["cold_discovery_s"])],
        ["load_index, warm (other ranks)", result["warm_load_index_s"], None,
         ratio(result["warm_load_index_s"], result["cold_discovery_s"])],
    ]
    m = result["machine"]
    lines = [
        f"Discovery of {n:,} images ({result['data_mb']} MiB, {result['buckets']} buckets, "
        f"{result['indexed']:,} indexed) on {m['cpus']} CPUs, load {m['load_average_1_5_15']}",
        format_table(["", "seconds", "images/s", "x cold"], rows),
    ]
    if result["decode_loop_extrapolated"]:
        lines.append(f"decode loop: {result['decode_loop_images_decoded']:,} images decoded "
                     "(an even sample), time extrapolated to all")
    lines.append(f"warm start (refresh + load_index): {result['warm_start_s']:.2f} s; metadata "
                 f"cache {result['metadata_cache_mb']} MiB")
    lines += [f"  {verdict(ok):6s} {name}" for name, ok in result["targets"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--tiny", action="store_true",
                        help="8-64 px images: quick to generate, but decoding them costs about "
                        "what a header read does, so the 10x target does not apply")
    parser.add_argument("--folder", type=Path, help="measure this folder instead of generating")
    parser.add_argument("--decode-limit", type=int, default=3000,
                        help="decode at most this many (an even sample); 0 = every image")
    parser.add_argument("--repeats", type=int, default=3, help="warm runs; the median counts")
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, images=20, tiny=True, repeats=1, decode_limit=10)
    root = args.folder or ensure_images(args.images, args.tiny)
    result = {"machine": machine(), "folder": str(root), **measure(root, args.decode_limit,
                                                                   args.repeats)}
    result["machine_after"] = machine()["load_average_1_5_15"]
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
