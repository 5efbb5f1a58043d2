"""What the run report shows, read from output_dir alone (torch-free): the status (run_log.py),
the steps and evaluations of events.jsonl (events.py; a run folder written before it holds
training_steps.jsonl and eval_loss.jsonl instead), validation/step-*/, skipped_files.json, the
sample trace with its plan, and the checkpoints' manifests. A file that is missing is left out
of the page; one that cannot be read is named in the page's notes, with why; neither stops the
page.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from simpletuner.helpers.multiaspect.trace import read_trace
from simpletuner.helpers.multiaspect.verify import verify
from simpletuner.training.checkpointing.folders import complete_checkpoints
from simpletuner.training.checkpointing.manifest import (MANIFEST, CheckpointError,
                                                         verify_checkpoint)
from simpletuner.training.reporting.events import (EVENTS_FILE, SKIPPED_FILES, SKIPPED_SUMMARY,
                                                   SKIPS_NAMED)
from simpletuner.training.reporting.run_log import PLAN_FILE, STATUS_FILE

# What a run folder written before events.jsonl holds instead: its step and eval logs.
OLD_STEP_LOG, OLD_EVAL_LOG = "training_steps.jsonl", "eval_loss.jsonl"
_STEP_FOLDER = re.compile(r"^step-(\d+)$")
_IMAGE = re.compile(r"^(?:image-(\d+)\.png|clip-(\d+)\.webp)$")  # a video family's: its clips


@dataclass
class ValidationImage:
    path: str          # relative to output_dir, as the page links it
    prompt: str
    size: tuple[int, int]


@dataclass
class CheckpointEntry:
    step: int
    name: str
    files: int
    size: int
    verified: str      # what was checked and what it found


@dataclass
class ExactlyOnce:
    lines: list[str]                       # the audit's lines, verdict last
    per_rank: dict[int, dict[int, int]]    # epoch -> rank -> samples assigned
    ok: bool


@dataclass
class ReportData:
    output_dir: Path
    status: dict
    steps: list[dict]
    evals: list[dict]
    validation: dict[int, list[ValidationImage]]   # step -> images, in saved order
    skipped: dict[str, dict[str, dict]]  # dataset id -> reason -> {count, first names}
    checkpoints: list[CheckpointEntry]
    exactly_once: ExactlyOnce | None
    exactly_once_deferred: bool = False  # a trace to check, left for the run's end
    notes: list[str] = field(default_factory=list)  # files that could not be read, and why


def read_report_data(output_dir: Path, *, verify_hashes: bool,
                     check_trace: bool = True) -> ReportData:
    """``verify_hashes``: recompute every checkpoint file's SHA-256 (the report command), else
    check sizes against the manifests only (the run: cheap at every checkpoint).
    ``check_trace``: run the exactly-once check of the trace (its cost grows with the samples
    trained, so the run makes it at its end only)."""
    output_dir = Path(output_dir)
    notes: list[str] = []
    status = _read_json(output_dir / STATUS_FILE, notes) or {"status": "unknown"}
    trace = output_dir / "trace"
    steps, evals = _steps_and_evals(output_dir, notes)
    return ReportData(
        output_dir=output_dir, status=status, steps=steps, evals=evals,
        validation=_validation_images(output_dir, notes),
        skipped=_skipped_summary(output_dir, notes),
        checkpoints=[_checkpoint_entry(step, folder, verify_hashes)
                     for step, folder in complete_checkpoints(output_dir)],
        exactly_once=_exactly_once(trace, notes) if check_trace else None,
        exactly_once_deferred=not check_trace and (trace / PLAN_FILE).is_file(),
        notes=notes)


def _steps_and_evals(output_dir: Path, notes: list[str]) -> tuple[list[dict], list[dict]]:
    """The step and eval records: events.jsonl's, or an older run's own two logs."""
    if not (output_dir / EVENTS_FILE).is_file() and (
            (output_dir / OLD_STEP_LOG).is_file() or (output_dir / OLD_EVAL_LOG).is_file()):
        return (_read_jsonl(output_dir / OLD_STEP_LOG, notes),
                _read_jsonl(output_dir / OLD_EVAL_LOG, notes))
    events = _read_jsonl(output_dir / EVENTS_FILE, notes)
    return ([e for e in events if e.get("type") == "step"],
            [e for e in events if e.get("type") == "eval"])


def _skipped_summary(output_dir: Path, notes: list[str]) -> dict[str, dict[str, dict]]:
    """The skips by reason the run summarised; a run from before the summary: counted from
    its full list."""
    summary = _read_json(output_dir / SKIPPED_SUMMARY, notes)
    if summary is not None:
        return summary
    summary = {}
    for dataset, entries in (_read_json(output_dir / SKIPPED_FILES, notes) or {}).items():
        by_reason = summary.setdefault(dataset, {})
        for entry in entries:
            named = by_reason.setdefault(str(entry.get("reason", "unknown")),
                                         {"count": 0, "first": []})
            named["count"] += 1
            if len(named["first"]) < SKIPS_NAMED:
                named["first"].append(str(entry.get("path", "?")))
    return summary


def _read_json(path: Path, notes: list[str]):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name}: not readable ({exc})")
        return None


def _read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    """The complete records; a torn or damaged line ends the list, with a note."""
    if not path.is_file():
        return []
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name}: not readable ({exc})")
        return []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            notes.append(f"{path.name}: line {number} is not a complete record; "
                         "the lines from there are left out")
            break
        records.append(record)
    return records


def _validation_images(output_dir: Path, notes: list[str]) -> dict[int, list[ValidationImage]]:
    found: dict[int, list[ValidationImage]] = {}
    folder = output_dir / "validation"
    if not folder.is_dir():
        return found
    for step_folder in folder.iterdir():
        match = _STEP_FOLDER.match(step_folder.name)
        if not match or not step_folder.is_dir():
            continue
        images = sorted((int(m.group(1) or m.group(2)), path) for path in step_folder.iterdir()
                        if (m := _IMAGE.match(path.name)))
        found[int(match.group(1))] = [image for _, path in images
                                      if (image := _validation_image(output_dir, path, notes))]
    return dict(sorted(found.items()))


def _validation_image(output_dir: Path, path: Path, notes: list[str]) -> ValidationImage | None:
    """The prompt is in the PNG's text (models/pipelines.py writes it there); a clip's in its
    frame strip's (validation_clips.py). An edit's side-by-side (validation_edits.py) is shown
    in its result's place."""
    try:
        with Image.open(path) as image:
            size = image.size
        text_from = path.with_name(f"{path.stem}-frames.png") if path.suffix == ".webp" else path
        with Image.open(text_from) as image:
            prompt = str(image.info.get("prompt", ""))
    except (OSError, ValueError) as exc:
        notes.append(f"{path.relative_to(output_dir)}: not readable ({exc})")
        return None
    edit = path.with_name(path.name.replace("image-", "edit-", 1))  # reference | result
    shown = edit if path.suffix == ".png" and edit.is_file() else path
    return ValidationImage(shown.relative_to(output_dir).as_posix(), prompt, size)


def _checkpoint_entry(step: int, folder: Path, verify_hashes: bool) -> CheckpointEntry:
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        count, size = len(files), sum(int(entry["size"]) for entry in files.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return CheckpointEntry(step, folder.name, 0, 0, f"unreadable {MANIFEST}: {exc}")
    try:
        if verify_hashes:
            verify_checkpoint(folder)
            verified = f"every file's size and SHA-256 match {MANIFEST}"
        else:
            _check_sizes(folder, files)
            verified = (f"every file's size matches {MANIFEST} (SHA-256 checked when "
                        "written; `python -m simpletuner report` checks it again)")
    except CheckpointError as exc:
        verified = f"FAILED: {exc}"
    return CheckpointEntry(step, folder.name, count, size, verified)


def _check_sizes(folder: Path, files: dict) -> None:
    for name, entry in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path.name}: missing file (listed in {MANIFEST})")
        if path.stat().st_size != int(entry["size"]):
            raise CheckpointError(f"{path.name}: {path.stat().st_size} bytes, the manifest "
                                  f"says {entry['size']}")


def _exactly_once(trace_folder: Path, notes: list[str]) -> ExactlyOnce | None:
    """The audit's check of the epochs in the trace (trace_samples), against the plan the run
    wrote. An epoch still in progress, or cut short by max_train_steps, shows as missing."""
    plan = _read_json(trace_folder / PLAN_FILE, notes)
    if plan is None:
        return None
    try:
        ranks = plan["world_size"] * plan.get("context_parallel", 1)  # groups x their ranks
        traces = {rank: read_trace(trace_folder, rank) for rank in range(ranks)}
    except ValueError as exc:  # a rank's trace missing, or a line being written
        notes.append(f"exactly-once check not made: {exc}")
        return None
    trained = {r["epoch"] for records in traces.values() for r in records}
    plan = dict(plan, epochs={e: v for e, v in plan["epochs"].items() if int(e) in trained})
    report = verify(plan, traces)
    per_rank: dict[int, dict[int, int]] = {}
    for rank, records in traces.items():
        counts = Counter()
        for record in records:
            if not record["stand_in"]:
                counts[record["epoch"]] += len(record["samples"])
        for epoch, count in counts.items():
            per_rank.setdefault(epoch, {})[rank] = count
    return ExactlyOnce(report.lines(), dict(sorted(per_rank.items())), report.ok)
