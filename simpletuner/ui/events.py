"""Server-Sent Events tailing a run's output/events.jsonl: each complete line is one event
whose id is its line number (1-based), so a client reconnecting with Last-Event-ID continues
after the last line it saw. A resumed run cuts the file back to its checkpoint's lines; the
stream then continues from the new end. The stream ends once the run is no longer active and
every line has been sent. A run by a trainer that writes no events.jsonl (its steps only in
training_steps.jsonl, which events.jsonl replaces) streams those lines as step events."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from starlette.requests import Request
from starlette.responses import StreamingResponse

from simpletuner.training.reporting.report_data import OLD_STEP_LOG as STEP_LOG
from simpletuner.ui import run_files
from simpletuner.ui.context import UiContext
from simpletuner.ui.queue_db import ACTIVE

POLL_S = 0.5
KEEPALIVE_POLLS = 30  # a comment line every 15 s keeps proxies from closing an idle stream


class LineTail:
    """The complete lines a growing file gained since the last read, numbered."""

    def __init__(self, path: Path, after_line: int):
        self.path, self.line, self.offset = path, 0, 0
        self._skip = after_line

    def read(self) -> list[tuple[int, str]]:
        try:
            with open(self.path, "rb") as file:
                size = file.seek(0, 2)
                if size < self.offset:  # cut back: its lines are the ones already sent
                    file.seek(0)
                    kept = file.read(size)
                    self.offset = kept.rfind(b"\n") + 1
                    self.line = kept.count(b"\n", 0, self.offset)
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = []
        for raw in complete.splitlines():
            self.line += 1
            if self.line > self._skip and raw.strip():
                lines.append((self.line, raw.decode("utf-8", errors="replace")))
        return lines


class RunEvents:
    """The run's events.jsonl lines; while it has none but a step log, the step log's lines as
    ``{"type": "step", ...}`` events."""

    def __init__(self, output: Path, after_line: int):
        self.events = LineTail(output / run_files.EVENTS_NAME, after_line)
        self.steps = LineTail(output / STEP_LOG, after_line)

    def read(self) -> list[tuple[int, str]]:
        if self.events.path.exists() or not self.steps.path.exists():
            return self.events.read()
        return [(number, _as_step_event(line)) for number, line in self.steps.read()]


def _as_step_event(line: str) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        return line
    return json.dumps({"type": "step", **record}) if isinstance(record, dict) else line


def _last_event_id(request: Request) -> int:
    value = request.headers.get("last-event-id", "") or request.query_params.get("after", "")
    return int(value) if value.isdigit() else 0


def event_stream(request: Request, ui: UiContext, run_id: str) -> StreamingResponse:
    tail = RunEvents(run_files.output_of(ui.workspace.run_folder(run_id)),
                     _last_event_id(request))

    async def stream():
        idle = 0
        while not await request.is_disconnected():
            record = ui.queue.get(run_id)
            lines = tail.read()
            for number, line in lines:
                yield f"id: {number}\ndata: {line}\n\n"
            if not lines and (record is None or record.state not in ACTIVE):
                yield f"event: close\ndata: {record.state if record else 'gone'}\n\n"
                return
            idle = 0 if lines else idle + 1
            if idle >= KEEPALIVE_POLLS:
                idle = 0
                yield ": keep-alive\n\n"
            await asyncio.sleep(POLL_S)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"cache-control": "no-store", "x-accel-buffering": "no"})
