"""How `plan` shows an index: a text table per dataset and a bucket histogram PNG."""

from __future__ import annotations

from collections.abc import Mapping
from io import BytesIO
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from simpletuner.common.atomic import atomic_write_bytes
from simpletuner.helpers.metadata.buckets import parse_bucket_key
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.split import DatasetSpec

BAR_COLOUR, UNDERSIZED_COLOUR = (70, 110, 200), (210, 50, 50)


def _bucket_order(index: DatasetIndex) -> list[str]:
    # Landscape-most first, so the table reads like the aspect range it covers.
    def aspect(key: str) -> tuple[float, str]:
        width, height = parse_bucket_key(key)
        return (-width / height, key)

    return sorted(index.buckets, key=aspect)


def bucket_table(index: DatasetIndex) -> str:
    total = index.sample_count
    rows = [("bucket", "clips" if index.clips else "images", "share")]
    for key in _bucket_order(index):
        count = len(index.buckets[key])
        rows.append((key, str(count), f"{100 * count / total:.1f}%"))
    rows.append(("total", str(total), "100.0%" if total else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def skip_summary(index: DatasetIndex) -> str:
    if not index.skipped:
        return "skipped: none"
    counts = index.skipped.counts()  # a line per reason, however many files give it
    lines = [f"skipped: {len(index.skipped)}"]
    by_count = sorted(counts.items(), key=lambda rc: (-rc[1], rc[0]))
    lines += [f"  {count:>6}  {reason}" for reason, count in by_count]
    return "\n".join(lines)


def undersized_buckets(spec: DatasetSpec, processes: int, accumulation: int) -> set[str]:
    """Buckets whose occurrences per epoch (samples x (repeats + 1)) cannot fill one
    effective batch E on ``processes`` ranks; an evaluation set of any size can be evaluated."""
    if spec.evaluation:
        return set()
    effective = spec.effective_batch(processes, accumulation).total
    return {key for key, ids in spec.buckets.items()
            if len(ids) * (spec.repeats + 1) < effective}


def write_histogram(indexes: list[DatasetIndex], path: Path,
                    undersized: Mapping[str, set[str]] | None = None) -> None:
    """One horizontal bar per bucket, one section per dataset, drawn with Pillow. Buckets in
    ``undersized`` (dataset id -> bucket keys) are drawn red and marked '< E'."""
    undersized = undersized or {}
    row, label_w, bar_w, margin = 16, 90, 520, 10
    sections = [(index, _bucket_order(index)) for index in indexes]
    height = margin + sum(2 * row + max(1, len(keys)) * row for _, keys in sections) + margin
    image = Image.new("RGB", (label_w + bar_w + 80 + 2 * margin, height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    y = margin
    for index, keys in sections:
        draw.text((margin, y), f"dataset {index.dataset_id}: {index.sample_count} images, "
                  f"{len(index.skipped)} skipped", fill="black", font=font)
        y += 2 * row
        largest = max((len(ids) for ids in index.buckets.values()), default=1)
        for key in keys:
            count = len(index.buckets[key])
            length = max(1, round(bar_w * count / largest))
            small = key in undersized.get(index.dataset_id, ())
            draw.text((margin, y + 2), key, fill="black", font=font)
            draw.rectangle([margin + label_w, y + 2, margin + label_w + length, y + row - 3],
                           fill=UNDERSIZED_COLOUR if small else BAR_COLOUR)
            draw.text((margin + label_w + length + 6, y + 2),
                      f"{count} < E" if small else str(count), fill="black", font=font)
            y += row
        if not keys:
            draw.text((margin, y + 2), "(no images)", fill="gray", font=font)
            y += row
    buffer = BytesIO()
    image.save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())
