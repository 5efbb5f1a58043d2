"""The datasets page's data: a folder's images with their size, bucket and caption, the bucket
histogram, thumbnails (made once with Pillow into DIR/thumbnails/, named by the image's path,
mtime and size, so an edited image gets a new one), a caption written back atomically as the
.txt beside its image, and the dataset roots of workspace.json. Every path is confined to the
workspace and its dataset roots (a caption that is a symlink out is neither read nor written)."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from simpletuner.common.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from simpletuner.helpers.metadata.buckets import BucketSettings, bucket_for
from simpletuner.ui.workspace import SETTINGS_NAME, PathRefused, Workspace

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
MAX_IMAGES = 300
MAX_CAPTION = 20000
THUMBNAIL_EDGE = 160
THUMBNAILS = "thumbnails"


@dataclass(frozen=True)
class FolderImage:
    path: Path
    width: int
    height: int
    bucket: str
    caption: str | None


def folder_images(workspace: Workspace, path: str, resolution: int,
                  alignment: int) -> tuple[Path, list[FolderImage], list[Path]]:
    """The confined folder, its first images (by name) with their bucket at ``resolution``
    pixels and ``alignment``, and its sub-folders; PathRefused outside the roots."""
    folder = workspace.confine(path)
    if not folder.is_dir():
        raise NotADirectoryError(f"{path} is not a folder")
    settings = BucketSettings(float(resolution), "pixel", alignment, False)
    children = sorted(folder.iterdir(), key=lambda child: child.name)
    images = []
    for child in children:
        if child.suffix.lower() in IMAGE_SUFFIXES and len(images) < MAX_IMAGES:
            image = _image(workspace, child, settings)
            if image is not None:
                images.append(image)
    return folder, images, [child for child in children if child.is_dir()]


def _image(workspace: Workspace, path: Path, settings: BucketSettings) -> FolderImage | None:
    try:
        with Image.open(workspace.confine(path)) as image:
            width, height = image.size
    except (OSError, UnidentifiedImageError, PathRefused):
        return None  # not an image, or a link out of the roots
    return FolderImage(path, width, height, bucket_for(width, height, settings),
                       read_caption(workspace, path))


def histogram(images: list[FolderImage]) -> list[tuple[str, int]]:
    """Images per bucket, the fullest first."""
    return Counter(image.bucket for image in images).most_common()


def caption_path(workspace: Workspace, image: str | Path) -> Path:
    """The .txt beside a confined image, itself confined (PathRefused otherwise)."""
    image_path = workspace.confine(image)
    if image_path.suffix.lower() not in IMAGE_SUFFIXES:
        raise PathRefused(f"{image} is not an image")
    return workspace.confine(image_path.with_suffix(".txt"))


def read_caption(workspace: Workspace, image: Path) -> str | None:
    try:
        return caption_path(workspace, image).read_text(encoding="utf-8", errors="replace")
    except (OSError, PathRefused):
        return None


def write_caption(workspace: Workspace, image: str, caption: str) -> Path:
    """The caption written atomically beside ``image`` (a run reading it sees the old or the
    new text, never a part)."""
    if len(caption) > MAX_CAPTION:
        raise ValueError(f"a caption is at most {MAX_CAPTION} characters")
    target = caption_path(workspace, image)
    if not workspace.confine(image).is_file():
        raise FileNotFoundError(f"{image} does not exist")
    atomic_write_text(target, caption)
    return target


def thumbnail(workspace: Workspace, image: str) -> Path:
    """The image's thumbnail (PNG), made on first use."""
    source = workspace.confine(image)
    stat = source.stat()
    key = hashlib.sha256(f"{source}\0{stat.st_mtime_ns}\0{stat.st_size}".encode(
        "utf-8", "surrogateescape")).hexdigest()
    made = workspace.root / THUMBNAILS / key[:2] / f"{key}.png"
    if not made.exists():
        made.parent.mkdir(parents=True, exist_ok=True)
        with Image.open(source) as picture:
            picture.thumbnail((THUMBNAIL_EDGE, THUMBNAIL_EDGE))
            encoded = io.BytesIO()
            picture.convert("RGB").save(encoded, format="PNG")
        atomic_write_bytes(made, encoded.getvalue())
    return made


def set_dataset_roots(workspace: Workspace, roots) -> list[str]:
    """workspace.json's dataset_roots replaced: each an existing folder, absolute or relative
    to the workspace, never the filesystem's root; ValueError naming the first that is not."""
    if not isinstance(roots, list) or not all(isinstance(root, str) for root in roots):
        raise ValueError("'dataset_roots' must be a list of folder paths")
    for root in roots:
        resolved = (workspace.root / root).resolve()
        if not resolved.is_dir() or resolved == Path(resolved.anchor):
            raise ValueError(f"dataset root {root!r} is not a folder (or is the filesystem's "
                             "root)")
    settings = _settings(workspace)
    atomic_write_json(workspace.root / SETTINGS_NAME, {**settings, "dataset_roots": roots},
                      indent=1)
    return roots


def _settings(workspace: Workspace) -> dict:
    try:
        value = json.loads((workspace.root / SETTINGS_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
