"""The queue: one SQLite table (stdlib sqlite3, WAL) of every run the UI made, its place in the
queue, its state and, once launched, the pid of its process group, so that a restarted server
finds its runs. Each change is one transaction that checks the state it changes from, so the
scheduler and a request racing on one run cannot both win."""

from __future__ import annotations

import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

QUEUED, STARTING, RUNNING = "queued", "starting", "running"
CANCELLED = "cancelled"
ACTIVE = (QUEUED, STARTING, RUNNING)

_SCHEMA = """CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, position INTEGER NOT NULL, state TEXT NOT NULL,
    pid INTEGER, process_start TEXT, exit_status INTEGER, message TEXT,
    created_at REAL NOT NULL, started_at REAL, ended_at REAL, devices TEXT)"""
# A queue written before --devices existed gains the column (NULL: no GPU set).
_COLUMNS_ADDED = {"devices": "ALTER TABLE runs ADD COLUMN devices TEXT"}


@dataclass(frozen=True)
class RunRecord:
    id: str
    name: str
    position: int
    state: str
    pid: int | None
    process_start: str | None
    exit_status: int | None
    message: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    devices: str | None = None  # the GPU set it trains on (--devices), as CUDA_VISIBLE_DEVICES


class RunQueue:
    def __init__(self, path: Path):
        self.path = Path(path)
        with self._transaction() as db:
            db.execute(_SCHEMA)
            present = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
            for column, statement in _COLUMNS_ADDED.items():
                if column not in present:
                    db.execute(statement)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A connection per use (the scheduler thread and the request threads each open their
        own); BEGIN IMMEDIATE takes the write lock at once, so a check-then-update holds."""
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            db.close()

    def _select(self, where: str = "", args: tuple = ()) -> list[RunRecord]:
        with self._transaction() as db:
            rows = db.execute(f"SELECT * FROM runs {where} ORDER BY position", args).fetchall()
        return [RunRecord(*row) for row in rows]

    def all(self) -> list[RunRecord]:
        return self._select()

    def get(self, run_id: str) -> RunRecord | None:
        found = self._select("WHERE id = ?", (run_id,))
        return found[0] if found else None

    def in_state(self, *states: str) -> list[RunRecord]:
        return self._select(f"WHERE state IN ({', '.join('?' * len(states))})", states)

    def add(self, run_id: str, name: str) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO runs (id, name, position, state, created_at) VALUES "
                       "(?, ?, (SELECT COALESCE(MAX(position), 0) + 1 FROM runs), ?, ?)",
                       (run_id, name, QUEUED, time.time()))

    def _change(self, sql: str, args: tuple) -> bool:
        with self._transaction() as db:
            return db.execute(sql, args).rowcount == 1

    def claim(self, run_id: str) -> bool:
        """Queued -> starting; False when a request cancelled it first."""
        return self._change("UPDATE runs SET state = ? WHERE id = ? AND state = ?",
                            (STARTING, run_id, QUEUED))

    def mark_running(self, run_id: str, pid: int, process_start: str | None,
                     devices: str | None = None) -> None:
        self._change("UPDATE runs SET state = ?, pid = ?, process_start = ?, started_at = ?, "
                     "exit_status = NULL, message = NULL, ended_at = NULL, devices = ? "
                     "WHERE id = ?", (RUNNING, pid, process_start, time.time(), devices, run_id))

    def mark_ended(self, run_id: str, state: str, exit_status: int | None,
                   message: str | None) -> None:
        self._change("UPDATE runs SET state = ?, exit_status = ?, message = ?, ended_at = ? "
                     "WHERE id = ?", (state, exit_status, message, time.time(), run_id))

    def cancel(self, run_id: str) -> bool:
        return self._change("UPDATE runs SET state = ?, ended_at = ? WHERE id = ? AND state = ?",
                            (CANCELLED, time.time(), run_id, QUEUED))

    def delete(self, run_id: str) -> bool:
        """The record of an ended run removed (never a queued or running one)."""
        return self._change(f"DELETE FROM runs WHERE id = ? AND state NOT IN "
                            f"({', '.join('?' * len(ACTIVE))})", (run_id, *ACTIVE))

    def requeue(self, run_id: str) -> bool:
        """An ended run queued again, last in the queue."""
        return self._change(
            "UPDATE runs SET state = ?, position = (SELECT MAX(position) + 1 FROM runs) "
            f"WHERE id = ? AND state NOT IN ({', '.join('?' * len(ACTIVE))})",
            (QUEUED, run_id, *ACTIVE))

    def move(self, run_id: str, index: int) -> bool:
        """Put a queued run at ``index`` among the queued runs (0: next to start)."""
        with self._transaction() as db:
            rows = db.execute("SELECT id, position FROM runs WHERE state = ? ORDER BY position",
                              (QUEUED,)).fetchall()
            ids = [row[0] for row in rows]
            if run_id not in ids:
                return False
            ids.remove(run_id)
            ids.insert(max(0, min(index, len(ids))), run_id)
            # The queued runs keep the positions they held, handed out in the new order.
            for queued_id, (_, position) in zip(ids, rows):
                db.execute("UPDATE runs SET position = ? WHERE id = ?", (position, queued_id))
        return True
