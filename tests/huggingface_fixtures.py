"""Datasets written with the real datasets library for the ``type: huggingface`` tests: rows of
tiny generated PNGs with captions and sizes, saved with ``save_to_disk``, as an imagefolder, or
as a Hub snapshot in a Hugging Face cache folder (the layout ``hf download`` writes)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import datasets
from PIL import Image, ImageDraw

from training_fixtures import COLOURS

REVISION = "0123456789abcdef0123456789abcdef01234567"


def png(width: int, height: int, index: int) -> bytes:
    """A circle of one colour on another, different for each ``index``."""
    names = list(COLOURS)
    image = Image.new("RGB", (width, height), COLOURS[names[(index + 1) % 4]])
    ImageDraw.Draw(image).ellipse((width // 4, height // 4, 3 * width // 4, 3 * height // 4),
                                  fill=COLOURS[names[index % 4]])
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def shape_rows(sizes: list[tuple[int, int]]) -> list[dict]:
    """One row per size: image bytes, a caption naming the row, and the size as columns."""
    return [{"image": {"bytes": png(w, h, i), "path": None}, "text": f"shape number {i}",
             "w": w, "h": h} for i, (w, h) in enumerate(sizes)]


def features(rows: list[dict]) -> datasets.Features:
    kinds = {"image": datasets.Image(), "w": datasets.Value("int32"),
             "h": datasets.Value("int32")}
    return datasets.Features({name: kinds.get(name, _cell_kind(rows, name)) for name in rows[0]})


def _cell_kind(rows: list[dict], name: str):
    if isinstance(rows[0][name], dict):  # a struct of text fields
        return {field: datasets.Value("string") for field in rows[0][name]}
    if any(isinstance(row[name], list) for row in rows):
        return datasets.List(datasets.Value("string"))
    return datasets.Value("string")


def save_rows(folder: Path, splits: dict[str, list[dict]]) -> Path:
    """``DatasetDict.save_to_disk`` of the given splits (one split: a plain Dataset)."""
    parts = {name: datasets.Dataset.from_list(rows, features=features(rows), split=name)
             for name, rows in splits.items()}
    saved = next(iter(parts.values())) if len(parts) == 1 else datasets.DatasetDict(parts)
    saved.save_to_disk(str(folder))
    return folder


def imagefolder(folder: Path, sizes: list[tuple[int, int]]) -> Path:
    """PNG files with a metadata.jsonl of captions: the library keeps their paths in its rows."""
    (folder / "train").mkdir(parents=True)
    lines = []
    for i, (w, h) in enumerate(sizes):
        (folder / "train" / f"{i}.png").write_bytes(png(w, h, i))
        lines.append(json.dumps({"file_name": f"{i}.png", "text": f"file shape {i}"}))
    (folder / "train" / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def hub_snapshot(hf_home: Path, repo_id: str, rows: list[dict], scratch: Path) -> Path:
    """``repo_id`` as downloaded into the Hub cache under ``hf_home``: a parquet data file in
    snapshots/<revision>/, refs/main naming it."""
    repo = hf_home / "hub" / f"datasets--{repo_id.replace('/', '--')}"
    data = repo / "snapshots" / REVISION / "data"
    data.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    written = scratch / "train.parquet"
    datasets.Dataset.from_list(rows, features=features(rows)).to_parquet(str(written))
    shutil.move(written, data / "train-00000-of-00001.parquet")
    return repo
