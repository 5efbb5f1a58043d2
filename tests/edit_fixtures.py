"""Edit pairs for the tests: a folder of targets (a circle recoloured as the caption says) and a
folder of references (the same circle before), matched by name; plus the datasets naming them."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from training_fixtures import COLOURS


def circle(colour: str, background: str, size: tuple[int, int]) -> Image.Image:
    w, h = size
    image = Image.new("RGB", size, COLOURS[background])
    ImageDraw.Draw(image).ellipse((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=COLOURS[colour])
    return image


def make_edit_pairs(root: Path, count: int = 8, sizes: tuple[tuple[int, int], ...] = ((64, 64),),
                    reference_suffix: str = ".jpg") -> tuple[Path, Path, list[str]]:
    """``count`` pairs per size: targets/<name>.png with its caption, references/<name><suffix>
    (another extension: pairs match by stem). Returns both folders and the target ids."""
    targets, references = root / "targets", root / "references"
    targets.mkdir(parents=True, exist_ok=True)
    references.mkdir(parents=True, exist_ok=True)
    names, ids = list(COLOURS), []
    for w, h in sizes:
        for i in range(count):
            before, after, background = names[i % 4], names[(i + 1) % 4], names[(i + 2) % 4]
            name = f"{w}x{h}-{i:02d}"
            circle(after, background, (w, h)).save(targets / f"{name}.png")
            (targets / f"{name}.txt").write_text(f"make the circle {after}")
            circle(before, background, (w, h)).save(references / f"{name}{reference_suffix}",
                                                    quality=95)
            ids.append(f"{name}.png")
    return targets, references, ids


def edit_datasets(targets: Path, references: Path, **target_keys) -> list[dict]:
    """multidatabackend.json entries: the targets naming their reference dataset."""
    return [{"id": "edits", "instance_data_dir": str(targets), "caption_strategy": "textfile",
             "conditioning_data": "edit-references", **target_keys},
            {"id": "edit-references", "dataset_type": "conditioning",
             "conditioning_type": "reference_strict", "instance_data_dir": str(references)}]
