"""The edit demo: pairs for Flux Kontext made from the demo shapes (demo_data.py). Each pair is
a shape (the reference, ``references/<stem>.png``) and the same shape recoloured as its caption
says (the target, ``edits/<stem>.png`` with ``edits/<stem>.txt``: "make the circle blue"),
generated deterministically on first use, each file atomically, the marker last.
``python -m simpletuner.demo_edits FOLDER`` does the same; point a training dataset at
``edits/`` with ``conditioning_data`` naming a conditioning dataset on ``references/``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simpletuner.common.atomic import atomic_write_bytes, atomic_write_text
from simpletuner.demo_data import (COLOURS, DemoImage, demo_images, generate_main,
                                   marker_matches, render, write_marker)

VERSION = 1
MARKER = ".demo-edits.json"
EDITS, REFERENCES = "edits", "references"


def edit_pairs() -> list[tuple[DemoImage, DemoImage]]:
    """(reference, target) per demo image: the target's colour is the next one in COLOURS
    that is neither the shape's nor the background's."""
    names = list(COLOURS)
    pairs = []
    for image in demo_images():
        start = names.index(image.colour)
        new = next(names[(start + k) % len(names)] for k in range(1, len(names))
                   if names[(start + k) % len(names)] != image.background)
        pairs.append((image, replace(image, colour=new)))
    return pairs


def instruction(target: DemoImage) -> str:
    return f"make the {target.shape} {target.colour}"


def _expected_marker() -> dict:
    return {"version": VERSION, "pairs": len(demo_images())}


def is_complete(folder: Path) -> bool:
    return marker_matches(folder / MARKER, _expected_marker()) and all(
        (folder / EDITS / f"{r.stem}{ext}").is_file() and (folder / REFERENCES / f"{r.stem}.png")
        .is_file() for r, _ in edit_pairs() for ext in (".png", ".txt"))


def ensure_edit_demo(folder: str | Path) -> Path:
    """Write the pairs into ``folder`` unless they are complete already; returns the folder."""
    folder = Path(folder)
    if is_complete(folder):
        return folder
    for sub in (EDITS, REFERENCES):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for reference, target in edit_pairs():
        atomic_write_bytes(folder / REFERENCES / f"{reference.stem}.png", render(reference))
        atomic_write_bytes(folder / EDITS / f"{reference.stem}.png", render(target))
        atomic_write_text(folder / EDITS / f"{reference.stem}.txt", instruction(target) + "\n")
    write_marker(folder / MARKER, _expected_marker())
    return folder


def main(argv: list[str] | None = None) -> int:
    return generate_main(ensure_edit_demo, "simpletuner.demo_edits", argv)


if __name__ == "__main__":
    raise SystemExit(main())
