"""Inline SVG charts for the run report: series against step with labelled axes, and a
horizontal bar histogram. No script: each series carries its plotted points as data attributes
(what a test or a reader's tool can take back) and each point's value in a hover title."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 78, 16, 14, 40
MAX_POINTS = 2000   # a longer series is thinned to this many points (every k-th, last kept)
MAX_MARKERS = 300   # hover circles only up to this many points


@dataclass
class Series:
    name: str
    css_class: str
    points: list[tuple[int, float]]   # (step, value), finite values only
    markers: bool = False


def nice_ticks(low: float, high: float, count: int = 5, smallest: float = 0.0) -> list[float]:
    """Round tick values from at or below ``low`` to at or above ``high``: steps of 1, 2 or 5
    times a power of ten, at least ``smallest`` apart (1 for steps)."""
    if not math.isfinite(low) or not math.isfinite(high):
        return []
    if high <= low:  # a constant series sits in the middle of the chart
        margin = abs(low) / 2 or 1.0
        low, high = low - margin, high + margin
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = max(smallest, next(m * power for m in (1, 2, 5, 10) if m * power >= raw))
    first = math.floor(low / step + 1e-9)
    last = math.ceil(high / step - 1e-9)
    return [round(index * step, 12) for index in range(first, max(last, first + 1) + 1)]


def tick_labels(ticks: list[float]) -> list[str]:
    """One format per axis: exponents when the axis' values are all small or large."""
    largest = max((abs(t) for t in ticks), default=0)
    if largest and (largest < 1e-2 or largest >= 1e5):
        return [f"{t:.1e}" if t else "0" for t in ticks]
    return [f"{t:.4g}" for t in ticks]


def thinned(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(points) <= MAX_POINTS:
        return points
    every = math.ceil(len(points) / MAX_POINTS)
    kept = points[::every]
    return kept if kept[-1] == points[-1] else kept + [points[-1]]


class _Frame:
    """Maps (step, value) into the plot area."""

    def __init__(self, steps: tuple[int, int], values: tuple[float, float]):
        self.x_ticks = nice_ticks(*steps, smallest=1)
        self.y_ticks = nice_ticks(*values)
        self.x_low, self.x_high = self.x_ticks[0], self.x_ticks[-1]
        self.y_low, self.y_high = self.y_ticks[0], self.y_ticks[-1]

    def x(self, step: float) -> float:
        span = (self.x_high - self.x_low) or 1
        return LEFT + (step - self.x_low) / span * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        span = (self.y_high - self.y_low) or 1
        return HEIGHT - BOTTOM - (value - self.y_low) / span * (HEIGHT - TOP - BOTTOM)


def _axes(frame: _Frame, y_label: str) -> list[str]:
    parts = [f'<line class="axis" x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
             f'y2="{HEIGHT - BOTTOM}"/>',
             f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}"/>']
    for tick, label in zip(frame.x_ticks, tick_labels(frame.x_ticks)):
        x = frame.x(tick)
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" '
                     f'y2="{HEIGHT - BOTTOM}"/><text class="tick" x="{x:.1f}" '
                     f'y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{label}</text>')
    for tick, label in zip(frame.y_ticks, tick_labels(frame.y_ticks)):
        y = frame.y(tick)
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" '
                     f'y2="{y:.1f}"/><text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{label}</text>')
    parts.append(f'<text class="label" x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 6}" '
                 'text-anchor="middle">step</text>')
    parts.append(f'<text class="label" transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2:.0f})'
                 f' rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
    return parts


def _series(frame: _Frame, series: Series) -> str:
    points = thinned(series.points)
    coordinates = " ".join(f"{frame.x(s):.1f},{frame.y(v):.1f}" for s, v in points)
    steps = " ".join(str(s) for s, _ in points)
    values = " ".join(repr(v) for _, v in points)
    body = [f'<polyline points="{coordinates}"/>']
    if series.markers and len(points) <= MAX_MARKERS:
        body += [f'<circle cx="{frame.x(s):.1f}" cy="{frame.y(v):.1f}" r="3"><title>step {s}: '
                 f'{v:.6g}</title></circle>' for s, v in points]
    return (f'<g class="series {series.css_class}" data-series="{escape(series.name)}" '
            f'data-steps="{steps}" data-values="{values}">{"".join(body)}</g>')


def _marks(frame: _Frame, steps: list[int]) -> str:
    """Vertical marks at steps skipped as non-finite."""
    lines = "".join(f'<line x1="{frame.x(s):.1f}" y1="{TOP}" x2="{frame.x(s):.1f}" '
                    f'y2="{HEIGHT - BOTTOM}"><title>step {s}: skipped (non-finite)</title></line>'
                    for s in steps)
    return (f'<g class="nonfinite" data-steps="{" ".join(str(s) for s in steps)}">{lines}</g>')


def line_chart(title: str, y_label: str, series: list[Series], *, step_range: tuple[int, int],
               marked_steps: list[int] = (), empty: str = "nothing logged yet") -> str:
    """An SVG chart of ``series`` against step over ``step_range``, with ``marked_steps`` as
    vertical marks; without any point, one line saying ``empty``."""
    values = [v for s in series for _, v in s.points]
    if not values and not marked_steps:
        return f'<p class="empty">{escape(title)}: {escape(empty)}.</p>'
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    frame = _Frame(step_range, (low, high))
    legend = " ".join(f'<span class="key {s.css_class}">{escape(s.name)}</span>' for s in series)
    parts = _axes(frame, y_label) + [_series(frame, s) for s in series if s.points]
    if marked_steps:
        parts.append(_marks(frame, list(marked_steps)))
        legend += ' <span class="key nonfinite">skipped (non-finite)</span>'
    return (f'<figure><figcaption>{escape(title)} {legend}</figcaption>'
            f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" role="img" aria-label="{escape(title)}">{"".join(parts)}</svg>'
            '</figure>')


def bar_chart(title: str, counts: dict[str, int]) -> str:
    """Horizontal bars, one per key, largest count first."""
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if not rows:
        return f'<p class="empty">{escape(title)}: no buckets.</p>'
    bar_height, label_width, width = 18, 110, 520
    largest = max(count for _, count in rows) or 1
    parts = []
    for row, (key, count) in enumerate(rows):
        y = row * (bar_height + 4)
        length = count / largest * (width - label_width - 60)
        parts.append(f'<g class="bar" data-bucket="{escape(key)}" data-count="{count}">'
                     f'<text x="{label_width - 6}" y="{y + 13}" text-anchor="end">'
                     f'{escape(key)}</text><rect x="{label_width}" y="{y}" width="{length:.1f}" '
                     f'height="{bar_height}"/><text x="{label_width + length + 6:.1f}" '
                     f'y="{y + 13}">{count}</text></g>')
    height = len(rows) * (bar_height + 4)
    return (f'<figure><figcaption>{escape(title)}</figcaption><svg class="bars" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
            f'aria-label="{escape(title)}">{"".join(parts)}</svg></figure>')
