"""What the benchmark scripts share: where generated data is kept, the machine's state, peak
memory, and the two outputs (a table for people, one JSON object with --json)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Sequence

from simpletuner.models.model_path import cache_root


def parse_with_smoke(parser: argparse.ArgumentParser, **smallest: Any) -> argparse.Namespace:
    """``parser``'s arguments and --smoke, which gives each option named in ``smallest`` that
    value: the script runs at its smallest, once, to show that it works and prints its table
    (tests/test_benchmarks_smoke.py runs every script so). Its figures then mean nothing."""
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest sizes, once: shows the script works; no figures")
    args = parser.parse_args()
    if args.smoke:
        for name, value in smallest.items():
            setattr(args, name, value)
    return args


def data_folder(name: str) -> Path:
    """Generated benchmark data, kept between runs beside the built-in models
    ($SIMPLETUNER_CACHE, else ~/.cache/simpletuner)."""
    return cache_root() / "benchmarks" / name


def machine() -> dict[str, Any]:
    """Figures are only comparable on the same machine under the same load: record both."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "load_average_1_5_15": [round(x, 2) for x in load],
            "python": platform.python_version(), "platform": platform.platform()}


# -- peak memory -------------------------------------------------------------------------------

def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def current_rss_mb() -> float:
    kib = _status_kib("VmRSS")
    if kib is None:  # not Linux: fall back to the peak so far
        return peak_rss_mb()
    return kib / 1024


def reset_peak_rss() -> bool:
    """Make the peak start at the current RSS (Linux >= 4.0: write 5 to clear_refs), so work
    done before (building inputs) does not hide the peak of what is measured next."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib / 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS


# -- output ------------------------------------------------------------------------------------

def ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(str(c)), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                       for i, (c, w) in enumerate(zip(columns, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def emit(result: dict[str, Any], as_json: bool, text: str) -> None:
    """One JSON object on stdout with --json (progress and notes go to stderr), else the text."""
    if as_json:
        json.dump(result, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(text)
