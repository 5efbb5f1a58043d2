"""The demo dataset: coloured shapes on plain backgrounds with matching captions, generated
deterministically (same bytes on every run and machine with the same Pillow/zlib) on first use.

``ensure_demo_dataset(folder)`` writes NNN-<colour>-<shape>-on-<colour>.png and a .txt caption
beside each, in three aspect ratios, each file atomically; the marker file is written last, so
an interrupted generation is redone. ``python -m simpletuner.demo_data FOLDER`` does the same.
"""

from __future__ import annotations

import io
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from simpletuner.common.atomic import atomic_write_bytes, atomic_write_text

VERSION = 2  # 2: 'an orange ...' captions
IMAGE_COUNT = 108
SIZES = [(96, 64), (64, 64), (64, 96)]  # (width, height): landscape, square, portrait
SHAPES = ["circle", "square", "triangle", "star"]
COLOURS = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
    "yellow": (240, 210, 40), "white": (245, 245, 245), "black": (20, 20, 20),
    "purple": (140, 60, 180), "orange": (245, 140, 30),
}
MARKER = ".demo-dataset.json"
SUPERSAMPLE = 4  # draw large, then downscale: smooth edges at 64 px
_SEED = 20240601


@dataclass(frozen=True)
class DemoImage:
    stem: str
    size: tuple[int, int]
    shape: str
    colour: str
    background: str
    centre: tuple[float, float]   # in pixels
    radius: float                 # in pixels

    @property
    def caption(self) -> str:
        article = "an" if self.colour[0] in "aeiou" else "a"
        return f"{article} {self.colour} {self.shape} on a {self.background} background"


def demo_images() -> list[DemoImage]:
    """The full plan. Only ``Random.random()`` is used: its sequence for a given seed is
    guaranteed stable across Python versions, unlike ``choice`` or ``randint``."""
    rng = random.Random(_SEED)
    names = list(COLOURS)

    def pick(options):
        return options[int(rng.random() * len(options))]

    plan = []
    for i in range(IMAGE_COUNT):
        shape = SHAPES[i % len(SHAPES)]
        width, height = SIZES[(i // len(SHAPES)) % len(SIZES)]
        colour = pick(names)
        background = pick([n for n in names if n != colour])
        radius = (0.28 + 0.1 * rng.random()) * min(width, height)
        margin = radius * 1.2 + 1  # the star and triangle reach 1.2 radii out
        centre = (margin + rng.random() * (width - 2 * margin),
                  margin + rng.random() * (height - 2 * margin))
        stem = f"{i:03d}-{colour}-{shape}-on-{background}"
        plan.append(DemoImage(stem, (width, height), shape, colour, background, centre, radius))
    return plan


def render(image: DemoImage) -> bytes:
    """PNG bytes of one planned image."""
    s = SUPERSAMPLE
    width, height = image.size
    canvas = Image.new("RGB", (width * s, height * s), COLOURS[image.background])
    draw = ImageDraw.Draw(canvas)
    cx, cy, r = image.centre[0] * s, image.centre[1] * s, image.radius * s
    fill = COLOURS[image.colour]
    if image.shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif image.shape == "square":
        half = r * 0.85
        draw.rectangle((cx - half, cy - half, cx + half, cy + half), fill=fill)
    elif image.shape == "triangle":
        draw.polygon(_regular_points(cx, cy + r * 0.15, r * 1.1, 3, inner=None), fill=fill)
    elif image.shape == "star":
        draw.polygon(_regular_points(cx, cy + r * 0.05, r * 1.2, 5, inner=0.5), fill=fill)
    else:
        raise ValueError(f"unknown demo shape {image.shape!r}")
    small = canvas.resize((width, height), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    small.save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


def _regular_points(cx: float, cy: float, r: float, corners: int,
                    inner: float | None) -> list[tuple[float, float]]:
    """Corners of an upright regular polygon, or a star when ``inner`` (radius ratio) is set."""
    points = []
    steps = corners * 2 if inner else corners
    for k in range(steps):
        radius = r * inner if inner and k % 2 else r
        angle = -math.pi / 2 + 2 * math.pi * k / steps
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _expected_marker() -> dict:
    return {"version": VERSION, "images": IMAGE_COUNT}


def marker_matches(path: Path, expected: dict) -> bool:
    """A demo generator's marker file at ``path`` holds ``expected`` (missing or torn: no)."""
    try:
        return json.loads(path.read_text()) == expected
    except (OSError, ValueError):
        return False


def write_marker(path: Path, expected: dict) -> None:
    atomic_write_text(path, json.dumps(expected, sort_keys=True) + "\n")


def is_complete(folder: Path) -> bool:
    """The marker matches this generator, and every image and caption is present."""
    return marker_matches(folder / MARKER, _expected_marker()) and all(
        (folder / f"{i.stem}{ext}").is_file() for i in demo_images() for ext in (".png", ".txt"))


def ensure_demo_dataset(folder: str | Path) -> Path:
    """Generate the demo dataset into ``folder`` unless it is already complete; returns the
    folder. Safe to call from several processes at once (identical bytes, atomic writes)."""
    folder = Path(folder)
    if is_complete(folder):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for image in demo_images():
        atomic_write_bytes(folder / f"{image.stem}.png", render(image))
        atomic_write_text(folder / f"{image.stem}.txt", image.caption + "\n")
    write_marker(folder / MARKER, _expected_marker())
    return folder


def generate_main(ensure: Callable[[str], Path], module: str, argv: list[str] | None) -> int:
    """``python -m <module> FOLDER``: ``ensure(FOLDER)``, printing the folder (demo_clips too)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} FOLDER", file=sys.stderr)
        return 2
    print(ensure(args[0]))
    return 0


def main(argv: list[str] | None = None) -> int:
    return generate_main(ensure_demo_dataset, "simpletuner.demo_data", argv)


if __name__ == "__main__":
    raise SystemExit(main())
