"""What a run's page shows besides its live curves, read from its output_dir as the run report
reads it (torch-free): the settings, the validation images (linked through the run's confined
file route), the checkpoints and the skipped files by reason; and the run's own files served
from its output_dir only."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from urllib.parse import urlencode

from simpletuner.training.reporting.report_data import ReportData, read_report_data
from simpletuner.training.reporting.report_sections import (exactly_once_section,
                                                              skipped_section)
from simpletuner.ui.workspace import PathRefused

SERVED_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def run_file(output_dir: Path, relative: str) -> Path:
    """``relative`` inside ``output_dir`` (symlinks resolved), an image; PathRefused else."""
    root = output_dir.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or path.suffix.lower() not in SERVED_SUFFIXES:
        raise PathRefused(f"{relative} is not an image of this run")
    return path


def image_url(run_id: str, relative: str) -> str:
    return f"/api/runs/{run_id}/file?{urlencode({'path': relative})}"


def _settings(data: ReportData) -> str:
    settings = data.status.get("settings") or {}
    rows = "".join(f"<tr><td>{escape(str(name))}</td><td>{escape(json.dumps(value))}</td></tr>"
                   for name, value in settings.items())
    return f"<h2>Settings</h2><table id=settings>{rows}</table>" if rows else ""


def _validation(run_id: str, data: ReportData) -> str:
    figures = "".join(
        f'<figure><img src="{escape(image_url(run_id, image.path))}" alt="step {step}">'
        f'<figcaption>step {step}: {escape(image.prompt)}</figcaption></figure>'
        for step, images in sorted(data.validation.items()) for image in images)
    return f"<h2>Validation</h2><div id=validation>{figures}</div>"


def _checkpoints(data: ReportData) -> str:
    items = "".join(f"<li>{escape(entry.name)} (step {entry.step}, {entry.files} files)</li>"
                    for entry in data.checkpoints)
    return f"<h2>Checkpoints</h2><ul id=checkpoints>{items}</ul>"


def details_html(run_id: str, output_dir: Path, *, ended: bool) -> str:
    """The sections below the curves; empty parts for a run that has not started. A traced
    run's exactly-once check once it has ended (its cost grows with the samples; while it
    trains the section says when it is checked)."""
    data = read_report_data(output_dir, verify_hashes=False, check_trace=ended)
    return (_validation(run_id, data) + _checkpoints(data) + skipped_section(data.skipped)
            + exactly_once_section(data.exactly_once, deferred=data.exactly_once_deferred)
            + _settings(data))
