"""output_dir/training_report.html: one self-contained page (inline CSS and SVG, images by path
relative to output_dir, no script, nothing fetched) from what report_data.py reads. Written
atomically, so a browser open on it never sees half a page."""

from __future__ import annotations

import time
from html import escape
from pathlib import Path

from simpletuner.common.atomic import atomic_write_text
from simpletuner.common.names import printable
from simpletuner.training.reporting.report_charts import Series, bar_chart, line_chart
from simpletuner.training.reporting.report_data import ReportData, read_report_data
from simpletuner.training.reporting.report_sections import (checkpoint_section,
                                                            exactly_once_section,
                                                            skipped_section, validation_section)

REPORT_FILE = "training_report.html"
SMOOTHING = 0.9  # exponential moving average, debiased (as tensorboard's smoothing slider)

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
.top{display:flex;flex-wrap:wrap;gap:48px}.top table td,.top table th{padding:1px 10px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #e6e6e6;
text-align:left;vertical-align:top}
.status{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600}
.status-running,.status-starting{background:#2f6fdb}.status-finished{background:#2e8b48}
.status-preempted{background:#c98a0b}.status-diverged,.status-failed{background:#c53030}
.status-unknown,.status-killed{background:#777}.message{white-space:pre-wrap;max-width:900px}
figure{margin:10px 0}figcaption{font-weight:600;margin-bottom:4px}
.chart .axis{stroke:#333}.chart .grid{stroke:#e3e3e3}.chart text{font-size:11px;fill:#333}
.chart .label{font-size:12px}.series polyline{fill:none;stroke-width:1.6}
.loss-raw polyline{stroke:#9db7e8}.loss-smoothed polyline{stroke:#1f4fb5;stroke-width:2.2}
.lr polyline{stroke:#7a3fb0}.eval polyline{stroke:#d0661a}.eval circle{fill:#d0661a}
.loss-raw circle{fill:#9db7e8}.lr circle{fill:#7a3fb0}
.nonfinite line{stroke:#d22;stroke-width:1.5;stroke-dasharray:3 2}
.key{font-weight:400;margin-left:12px;padding-left:14px;border-left:10px solid}
.key.loss-raw{border-color:#9db7e8}.key.loss-smoothed{border-color:#1f4fb5}
.key.lr{border-color:#7a3fb0}.key.eval{border-color:#d0661a}.key.nonfinite{border-color:#d22}
.bars rect{fill:#3d7bd9}.bars text{font-size:12px}
.grid-images td{text-align:center}.grid-images img{width:128px;image-rendering:pixelated;
border:1px solid #ccc}.prompt{max-width:260px;text-align:left!important}
.empty,.note{color:#666}.fail{color:#c53030;font-weight:600}.ok{color:#2e8b48;font-weight:600}
"""


def render_report(output_dir: Path, *, verify_hashes: bool = False,
                  check_trace: bool = True) -> Path:
    """Read what is on disk, write the page; returns its path."""
    return write_report(read_report_data(output_dir, verify_hashes=verify_hashes,
                                         check_trace=check_trace))


def write_report(data: ReportData) -> Path:
    path = data.output_dir / REPORT_FILE
    # Sample ids (skipped files, the trace's findings) may hold bytes that are not UTF-8: the
    # page shows them as 'bad\\xff.png', as the log does (common/names.py).
    atomic_write_text(path, printable(report_html(data)))
    return path


def report_html(data: ReportData) -> str:
    title = f"Training report: {data.output_dir.name}"
    top = (f'<div class="top"><div>{status_section(data)}</div>'
           f'<div>{settings_section(data.status.get("settings", {}))}</div></div>')
    sections = [top, "<h2>Curves</h2>" + curves(data), validation_section(data.validation),
                buckets_section(data.status.get("buckets", {})), skipped_section(data.skipped),
                exactly_once_section(data.exactly_once, deferred=data.exactly_once_deferred),
                checkpoint_section(data.checkpoints)]
    if data.notes:
        sections.append("<h2>Notes</h2><ul>" + "".join(
            f'<li class="note">{escape(n)}</li>' for n in data.notes) + "</ul>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>'
            f'{escape(title)}</title><style>{STYLE}</style></head><body><h1>{escape(title)}</h1>'
            + "".join(sections) + "</body></html>\n")


def _when(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def throughput(status: dict, steps: list[dict]) -> str:
    """Steps (and samples) per second over this attempt's steps: a resumed run's earlier
    attempts ran at other times; steps that compiled (dynamo_backend) are counted apart."""
    timed = [r for r in steps if r["step"] > status.get("resume_step", 0)
             and isinstance(r.get("time"), (int, float))]
    compiling = [r for r in timed if r.get("compiling")]
    if compiling:
        timed = [r for r in timed if r["step"] >= compiling[-1]["step"]]
    noted = (f" (after {sum(r['compiling'] for r in compiling):.0f} s compiling)"
             if compiling else "")
    if len(timed) < 2 or timed[-1]["time"] <= timed[0]["time"]:
        return "not measured yet" + noted
    per_second = (len(timed) - 1) / (timed[-1]["time"] - timed[0]["time"])
    text = f"{per_second:.3g} steps/s"
    if status.get("effective_batch"):
        text += f", {per_second * status['effective_batch']:.3g} samples/s"
    return text + noted


def status_section(data: ReportData) -> str:
    status = data.status
    name = str(status.get("status", "unknown"))
    badge = f'<span class="status status-{escape(name)}" id="status">{escape(name)}</span>'
    if "exit_status" in status:
        badge += f" exit status {int(status['exit_status'])}"
    rows = [("step", f"{status.get('step', 0)} of {status.get('total_steps', '?')}"),
            ("throughput", throughput(status, data.steps)),
            ("started", _when(status.get("started_at"))),
            ("updated", _when(status.get("updated_at")))]
    if isinstance(status.get("started_at"), (int, float)) and isinstance(
            status.get("updated_at"), (int, float)):
        rows.append(("time in this attempt",
                     _duration(status["updated_at"] - status["started_at"])))
    if status.get("resume_step"):
        rows.append(("resumed from step", str(status["resume_step"])))
    message = status.get("message")
    body = f"<p>{badge}</p>"
    if message:
        body += f'<p class="message" id="status-message">{escape(str(message))}</p>'
    return "<h2>Status</h2>" + body + _table(rows)


def settings_section(settings: dict) -> str:
    if not settings:
        return ""
    return "<h2>Settings</h2>" + _table([(k, str(v)) for k, v in settings.items()])


def smoothed(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    average, result = 0.0, []
    for count, (step, value) in enumerate(points, start=1):
        average = SMOOTHING * average + (1 - SMOOTHING) * value
        result.append((step, average / (1 - SMOOTHING ** count)))
    return result


def curves(data: ReportData) -> str:
    losses = [(r["step"], float(r["loss"])) for r in data.steps
              if not r.get("skipped") and isinstance(r.get("loss"), (int, float))]
    skipped = [r["step"] for r in data.steps if r.get("skipped")]
    rates = [(r["step"], float(r["lr"])) for r in data.steps
             if isinstance(r.get("lr"), (int, float))]
    evals = [(r["step"], float(r["eval_loss"])) for r in data.evals
             if isinstance(r.get("eval_loss"), (int, float))]
    last = max([data.status.get("total_steps") or 0] + [s for s, _ in losses + evals] + skipped)
    span = (0, max(last, 1))
    return "".join([
        line_chart("Training loss", "loss", [
            Series("loss", "loss-raw", losses, markers=True),
            Series(f"smoothed (EMA {SMOOTHING})", "loss-smoothed", smoothed(losses))],
            step_range=span, marked_steps=skipped),
        line_chart("Learning rate", "learning rate", [Series("lr", "lr", rates)],
                   step_range=span),
        line_chart("Evaluation loss", "eval loss",
                   [Series("eval loss", "eval", evals, markers=True)], step_range=span,
                   empty="none logged yet (eval_steps_interval and a dataset_type 'eval' "
                   "dataset turn it on)")])


def buckets_section(buckets: dict[str, dict[str, int]]) -> str:
    if not buckets:
        return ""
    return "<h2>Buckets</h2>" + "".join(
        bar_chart(f"{dataset}: {sum(counts.values())} samples in {len(counts)} buckets", counts)
        for dataset, counts in sorted(buckets.items()))


def _table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>"
                               for k, v in rows) + "</table>"
