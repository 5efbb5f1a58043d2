"""What every route needs, built once per app from its settings and kept on ``app.state.ui``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from simpletuner.ui import run_files
from simpletuner.ui.queue_db import QUEUED, RunQueue, RunRecord
from simpletuner.ui.settings import ServerSettings
from simpletuner.ui.workspace import Workspace


@dataclass(frozen=True)
class UiContext:
    settings: ServerSettings
    workspace: Workspace
    queue: RunQueue
    secret: str

    def run_view(self, record: RunRecord, queued: list[str] | None = None) -> dict:
        """A run as the API and the pages show it: the queue's record and the run's files.
        ``queued``: the queued runs' ids in order, when the caller has them."""
        folder = self.workspace.run_folder(record.id)
        queue_index = None
        if record.state == QUEUED:
            queued = queued if queued is not None else [r.id for r in self.queue.in_state(QUEUED)]
            queue_index = queued.index(record.id) if record.id in queued else None
        started, ended = record.started_at, record.ended_at
        elapsed = None
        if started is not None and record.state != QUEUED:
            elapsed = round((ended if ended and ended >= started else time.time()) - started, 1)
        return {"id": record.id, "name": record.name, "status": record.state,
                "exit_status": record.exit_status, "message": record.message, "pid": record.pid,
                "devices": record.devices,
                "step": run_files.last_step(folder), "max_steps": run_files.max_steps(folder),
                "queue_index": queue_index, "created_at": record.created_at,
                "started_at": started, "ended_at": ended, "elapsed": elapsed}

    def run_views(self) -> list[dict]:
        records = self.queue.all()
        queued = [record.id for record in records if record.state == QUEUED]
        return [self.run_view(record, queued) for record in records]
