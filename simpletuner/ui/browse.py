"""A dataset folder's listing for the UI: names and each image's caption file, read only
inside the workspace and its dataset roots (a caption that is a symlink out is not read)."""

from __future__ import annotations

from pathlib import Path

from simpletuner.ui.workspace import PathRefused, Workspace

MAX_ENTRIES = 500
MAX_CAPTION = 2000
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".mp4", ".webm", ".mov")


def list_folder(workspace: Workspace, path: str) -> dict:
    """The folder's first entries by name; PathRefused outside the roots."""
    folder = workspace.confine(path)
    if not folder.is_dir():
        raise NotADirectoryError(f"{path} is not a folder")
    children = sorted(folder.iterdir(), key=lambda child: child.name)
    entries = [_entry(workspace, child) for child in children[:MAX_ENTRIES]
               if not child.name.endswith(".txt")]
    return {"path": str(folder), "entries": entries, "truncated": len(children) > MAX_ENTRIES}


def _entry(workspace: Workspace, child: Path) -> dict:
    kind = "folder" if child.is_dir() else "file"
    caption = _caption(workspace, child) if child.suffix.lower() in IMAGE_SUFFIXES else None
    return {"name": child.name, "kind": kind, "caption": caption}


def _caption(workspace: Workspace, image: Path) -> str | None:
    try:
        text_file = workspace.confine(image.with_suffix(".txt"))
        return text_file.read_text(encoding="utf-8", errors="replace")[:MAX_CAPTION]
    except (PathRefused, OSError):
        return None
