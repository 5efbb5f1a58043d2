"""The run report's tables: the validation grid (prompts down, steps across), skipped files by
reason, the exactly-once summary and the checkpoint list."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from simpletuner.training.reporting.report_data import (CheckpointEntry, ExactlyOnce,
                                                        ValidationImage)

FIRST_NAMES = 5  # skipped files named per reason; skipped_files.json lists them all


def validation_section(validation: dict[int, list[ValidationImage]]) -> str:
    """Row ``i`` is the ``i``-th image of every step (one per prompt and validation size, in
    the order validation saves them), labelled with its prompt and size."""
    if not validation:
        return ""
    steps = sorted(validation)
    rows = max(len(images) for images in validation.values())
    head = "".join(f"<th>step {step}</th>" for step in steps)
    body = []
    for row in range(rows):
        label = next((images[row] for images in validation.values() if row < len(images)))
        cells = []
        for step in steps:
            images = validation[step]
            if row < len(images):
                image = images[row]
                cells.append(f'<td><img src="{quote(image.path)}" alt="step {step}: '
                             f'{escape(image.prompt)}" loading="lazy"></td>')
            else:
                cells.append("<td></td>")
        body.append(f'<tr><td class="prompt">{escape(label.prompt)}<br><span class="note">'
                    f'{label.size[0]}x{label.size[1]}</span></td>{"".join(cells)}</tr>')
    return ('<h2>Validation</h2><table class="grid-images"><tr><th>prompt</th>'
            f'{head}</tr>{"".join(body)}</table>')


def skipped_section(skipped: dict[str, dict[str, dict]]) -> str:
    """``skipped``: dataset id -> reason -> {count, first names} (report_data.py)."""
    total = sum(named["count"] for by_reason in skipped.values() for named in by_reason.values())
    if not total:
        return "<h2>Skipped files</h2><p class=\"empty\">No file was skipped.</p>"
    rows = []
    for dataset, by_reason in sorted(skipped.items()):
        for reason, named in sorted(by_reason.items(), key=lambda item: -item[1]["count"]):
            first = named["first"][:FIRST_NAMES]
            more = ", ..." if named["count"] > len(first) else ""
            rows.append(f'<tr class="skip-reason"><td>{escape(dataset)}</td><td>{escape(reason)}'
                        f'</td><td>{named["count"]}</td><td>{escape(", ".join(first) + more)}'
                        '</td></tr>')
    return (f"<h2>Skipped files</h2><p>{total} skipped; every one is in skipped_files.json."
            "</p><table><tr><th>dataset</th><th>reason</th><th>files</th><th>first</th></tr>"
            + "".join(rows) + "</table>")


def exactly_once_section(summary: ExactlyOnce | None, *, deferred: bool = False) -> str:
    if deferred:
        return ("<h2>Exactly once (trace_samples)</h2><p class=\"note\">Checked when the run "
                "ends; <code>python -m simpletuner report OUTPUT_DIR</code> checks it now.</p>")
    if summary is None:
        return ""
    verdict = "ok" if summary.ok else "fail"
    lines = "".join(f"<li>{escape(line)}</li>" for line in summary.lines[:-1])
    ranks = sorted({rank for counts in summary.per_rank.values() for rank in counts})
    head = "".join(f"<th>rank {rank}</th>" for rank in ranks)
    rows = "".join(f"<tr><td>epoch {epoch}</td>" + "".join(
        f"<td>{counts.get(rank, 0)}</td>" for rank in ranks) + "</tr>"
        for epoch, counts in summary.per_rank.items())
    return ("<h2>Exactly once (trace_samples)</h2>"
            f'<p class="{verdict}" id="exactly-once">{escape(summary.lines[-1])}</p>'
            f"<ul>{lines}</ul><p>Samples assigned per rank:</p><table><tr><th></th>{head}</tr>"
            f"{rows}</table><p class=\"note\">An epoch still running, or ended early by "
            "max_train_steps, shows its untrained samples as missing.</p>")


def _verdict_class(verified: str) -> str:
    return "fail" if verified.startswith("FAILED") else "ok"


def checkpoint_section(checkpoints: list[CheckpointEntry]) -> str:
    if not checkpoints:
        return "<h2>Checkpoints</h2><p class=\"empty\">No complete checkpoint.</p>"
    rows = "".join(
        f'<tr class="checkpoint"><td>{escape(c.name)}</td><td>{c.step}</td><td>{c.files}</td>'
        f'<td>{c.size / 1e6:.2f} MB</td><td class="{_verdict_class(c.verified)}">'
        f"{escape(c.verified)}</td></tr>" for c in checkpoints)
    return ("<h2>Checkpoints</h2><table><tr><th>folder</th><th>step</th><th>files</th>"
            f"<th>size</th><th>verified</th></tr>{rows}</table>")
