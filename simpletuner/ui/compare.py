"""`/compare?ids=a,b,...`: two or more runs' loss curves on one chart (inline SVG, drawn on
the server from each run's events.jsonl, or its training_steps.jsonl when it has none)."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from simpletuner.training.reporting.report_data import OLD_STEP_LOG as STEP_LOG
from simpletuner.ui import run_files
from simpletuner.ui.pages import page
from simpletuner.ui.workspace import PathRefused

COLOURS = ("#c30", "#036", "#393", "#939", "#c90", "#099", "#666", "#f6c")
MAX_RUNS = len(COLOURS)
WIDTH, HEIGHT = 700, 300


def step_losses(output_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of each step, in order; a resumed run's repeated steps as last written."""
    events = output_dir / run_files.EVENTS_NAME
    source, is_event_log = (events, True) if events.exists() else (output_dir / STEP_LOG, False)
    losses: dict[int, float] = {}
    try:
        lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            break  # a torn last line
        if is_event_log and record.get("type") != "step":
            continue
        if isinstance(record.get("step"), int) and isinstance(record.get("loss"), (int, float)):
            losses[record["step"]] = float(record["loss"])
    return sorted(losses.items())


def chart_svg(curves: list[tuple[str, list[tuple[int, float]]]]) -> str:
    points = [point for _, curve in curves for point in curve]
    if not points:
        return "<p>No steps yet.</p>"
    last = max(step for step, _ in points) or 1
    low = min(loss for _, loss in points)
    span = max(loss for _, loss in points) - low or 1.0
    lines = "".join(
        f'<polyline fill=none stroke="{COLOURS[i]}" points="'
        + " ".join(f"{5 + (WIDTH - 10) * step / last:.1f},"
                   f"{HEIGHT - 5 - (HEIGHT - 10) * (loss - low) / span:.1f}"
                   for step, loss in curve) + '"></polyline>'
        for i, (_, curve) in enumerate(curves))
    legend = "".join(f'<li><svg width=12 height=12><rect width=12 height=12 fill="{COLOURS[i]}">'
                     f"</rect></svg> {escape(name)}</li>" for i, (name, _) in enumerate(curves))
    return (f'<svg id=compare viewBox="0 0 {WIDTH} {HEIGHT}" width={WIDTH} height={HEIGHT}>'
            f'{lines}</svg><p>loss {low:.4g} to {low + span:.4g}, steps 0 to {last}</p>'
            f'<ul id=legend>{legend}</ul>')


async def compare_page(request: Request) -> HTMLResponse:
    ui = request.app.state.ui
    ids = [run_id for run_id in request.query_params.get("ids", "").split(",") if run_id]
    curves = []
    for run_id in ids[:MAX_RUNS]:
        record = ui.queue.get(run_id)
        try:
            folder = ui.workspace.run_folder(run_id)
        except PathRefused:
            record = None
        if record is None:
            return page(ui, "No such run", f"<p>{escape(run_id)}</p>", status_code=404)
        losses = await run_in_threadpool(step_losses, run_files.output_of(folder))
        curves.append((record.name, losses))
    return page(ui, "Compare runs", chart_svg(curves))


ROUTES = [Route("/compare", compare_page, methods=["GET"])]
