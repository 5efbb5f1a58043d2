"""Clip discovery: the project's probe (no full decode) against decoding every clip.

    python benchmarks/bench_video_discovery.py [--clips 120] [--size 320x240] [--json]

Generates N clips once (a block sliding over a gradient, 33-121 frames at 16 or 24 fps, MP4 / Matroska / WebM;
kept under $SIMPLETUNER_CACHE/benchmarks), then measures in one run, each pass after reading
every file once (OS page cache):

* cold discovery through the project: MetadataBackend.refresh_index of a dataset_type video
  dataset with an empty metadata cache (list, probe each clip on threads, bucket, write);
* the probes alone, on one thread and on the default threads (what the threads buy here);
* warm start, nothing changed: refresh_index, then load_index as another rank would;
* decoding every frame of every clip (one thread, PyAV): how a count is had without the
  container's. Its counts are compared with the probe's: a difference is reported.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
from tqdm import tqdm

from benchlib import data_folder, emit, format_table, machine, parse_with_smoke, ratio
from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.data_backend.storage import VIDEO_EXTENSIONS
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.backends.clip_source import probe_clips

# MP4 keeps a frame count; Matroska and WebM do not
SUFFIXES = {".mp4": "libx264", ".mkv": "libx264", ".webm": "libvpx-vp9"}
ORDER = (".mp4", ".mp4", ".mkv", ".webm")
GENERATOR_VERSION = 2
COMPLETE_MARKER = ".complete"


def ensure_clips(count: int, width: int, height: int) -> Path:
    folder = data_folder(f"video-discovery-v{GENERATOR_VERSION}-{width}x{height}-{count}")
    if (folder / COMPLETE_MARKER).exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for i in tqdm(range(count), desc=f"generating {count} clips in {folder}", unit="clip",
                  file=sys.stderr):
        write_clip(folder / f"clip{i:05d}{ORDER[i % len(ORDER)]}", width, height,
                   rng.randint(33, 121), rng.choice((16, 24)))
    (folder / COMPLETE_MARKER).write_text("done\n")
    return folder


def write_clip(path: Path, width: int, height: int, frames: int, fps: int) -> None:
    """A block sliding over a gradient: cheap to encode, decoded like any clip."""
    background = np.zeros((height, width, 3), np.uint8)
    background[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(SUFFIXES[path.suffix], rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for index in range(frames):
            picture = background.copy()
            x = index * 3 % (width - 32)
            picture[height // 3:height // 3 + 32, x:x + 32] = (250, 200, 40)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")))
        container.mux(stream.encode())


def decoded_frame_count(path: Path) -> int:
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def warm_page_cache(root: Path) -> None:
    for path in root.iterdir():
        path.read_bytes()


def backend_for(root: Path, output_dir: Path) -> MetadataBackend:
    training = TrainingConfig(model_family="wan", pretrained_model_name_or_path="none",
                              output_dir=str(output_dir), data_backend_config="none",
                              resolution=256, resolution_type="pixel")
    dataset = DatasetConfig(id="bench", dataset_type="video", instance_data_dir=str(root),
                            caption_strategy="filename",
                            video={"bucket_strategy": "resolution_frames"})
    return MetadataBackend.from_config(dataset, training)


def timed(call):
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def measure(root: Path) -> dict:
    storage = LocalStorage(root, VIDEO_EXTENSIONS)
    listing = storage.list_files()
    names, sizes = listing.sample_ids, listing.sizes
    with tempfile.TemporaryDirectory() as out:
        warm_page_cache(root)
        cold_s, index = timed(lambda: backend_for(root, Path(out)).refresh_index(
            show_progress=False))
        warm_page_cache(root)
        one_thread_s, probes = timed(lambda: probe_clips(storage, names, sizes, threads=1))
        threaded_s, _ = timed(lambda: probe_clips(storage, names, sizes))
        backend = backend_for(root, Path(out))
        warm_s, _ = timed(lambda: backend.refresh_index(show_progress=False))
        load_s, _ = timed(backend_for(root, Path(out)).load_index)
    warm_page_cache(root)
    decode_s, decoded = timed(lambda: [decoded_frame_count(root / name) for name in names])
    differing = [name for name, probe, count in zip(names, probes, decoded)
                 if probe.frames != count]
    by_duration = sum(probe.counted_by == "duration" for probe in probes)
    return {
        "clips": len(names), "frames": sum(decoded), "indexed": index.sample_count,
        "buckets": len(index.buckets), "data_mb": round(sum(sizes) / 2**20, 1),
        "counted_by_duration": by_duration, "counts_differing_from_decode": differing,
        "cold_discovery_s": round(cold_s, 3), "probe_one_thread_s": round(one_thread_s, 3),
        "probe_threaded_s": round(threaded_s, 3),
        "warm_discovery_s": round(warm_s, 3), "warm_load_index_s": round(load_s, 3),
        "decode_every_frame_s": round(decode_s, 3),
        "decode_over_cold": ratio(decode_s, cold_s),
        "one_thread_over_cold": ratio(one_thread_s, cold_s),
        "threaded_over_cold": ratio(threaded_s, cold_s),
    }


def render(result: dict) -> str:
    n = result["clips"]

    def per_s(seconds: float) -> int:
        return round(n / seconds) if seconds else 0

    rows = [
        ["decode every frame (PyAV, 1 thread)", result["decode_every_frame_s"],
         per_s(result["decode_every_frame_s"]), result["decode_over_cold"]],
        ["project probes alone, 1 thread", result["probe_one_thread_s"],
         per_s(result["probe_one_thread_s"]), result["one_thread_over_cold"]],
        ["project probes alone, threaded", result["probe_threaded_s"],
         per_s(result["probe_threaded_s"]), result["threaded_over_cold"]],
        ["project discovery, cold", result["cold_discovery_s"],
         per_s(result["cold_discovery_s"]), 1.0],
        ["project discovery, warm (main rank)", result["warm_discovery_s"],
         per_s(result["warm_discovery_s"]),
         ratio(result["warm_discovery_s"], result["cold_discovery_s"])],
        ["load_index, warm (other ranks)", result["warm_load_index_s"], None,
         ratio(result["warm_load_index_s"], result["cold_discovery_s"])],
    ]
    m = result["machine"]
    differing = result["counts_differing_from_decode"]
    return "\n".join([
        f"Discovery of {n:,} clips ({result['frames']:,} frames, {result['data_mb']} MiB, "
        f"{result['buckets']} buckets) on {m['cpus']} CPUs, load {m['load_average_1_5_15']}",
        format_table(["", "seconds", "clips/s", "x cold"], rows),
        f"frame counts: {n - result['counted_by_duration']} from the container, "
        f"{result['counted_by_duration']} from duration x rate; "
        f"{len(differing)} differ from the decoded count" + (f": {differing[:5]}" if differing
                                                             else ""),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=120)
    parser.add_argument("--size", default="320x240", help="WxH of the generated clips")
    parser.add_argument("--folder", type=Path, help="measure this folder instead of generating")
    parser.add_argument("--json", action="store_true")
    args = parse_with_smoke(parser, clips=2, size="64x48")
    width, height = (int(v) for v in args.size.split("x"))
    root = args.folder or ensure_clips(args.clips, width, height)
    result = {"machine": machine(), "folder": str(root), "pyav": av.__version__,
              **measure(root)}
    result["machine_after"] = machine()["load_average_1_5_15"]
    emit(result, args.json, render(result))


if __name__ == "__main__":
    main()
