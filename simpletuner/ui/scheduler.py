"""The scheduler: a loop in the server that notices runs whose processes have ended (their
exit status and message recorded in the queue) and starts queued runs, in queue order, while
fewer than ``slots`` run. After a restart it knows runs only by what the queue and the runs'
files say: the pid of the process group with its start time, and the output_dir lock."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from pathlib import Path

from simpletuner.training.run.output_dir_lock import OutputDirLock
from simpletuner.ui import processes, run_files
from simpletuner.ui.queue_db import QUEUED, RUNNING, STARTING, RunQueue, RunRecord
from simpletuner.ui.workspace import Workspace

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, workspace: Workspace, queue: RunQueue, slots: int, repo: Path,
                 devices: tuple[str, ...] = ()):
        """``devices``: a GPU set per slot (--devices); each run gets a free one."""
        self.workspace, self.queue, self.slots, self.repo = workspace, queue, slots, repo
        self.devices = devices
        self._children: dict[str, subprocess.Popen] = {}  # runs this server started

    async def run_forever(self, interval: float = 0.5) -> None:
        while True:
            try:
                await asyncio.to_thread(self.tick)
            except Exception:  # a full disk, a locked database: try again, keep serving
                logger.exception("the scheduler's pass failed")
            await asyncio.sleep(interval)

    def tick(self) -> None:
        for run in self.queue.in_state(RUNNING, STARTING):
            if not self._still_running(run):
                self._record_end(run)
        self._start_queued()

    def _still_running(self, run: RunRecord) -> bool:
        child = self._children.get(run.id)
        if child is not None:
            return child.poll() is None
        if run.pid is not None and processes.still_runs(run.pid, run.process_start):
            return True
        # A training process that outlived its launcher still holds the lock.
        output = run_files.output_of(self.workspace.run_folder(run.id))
        return OutputDirLock(output).in_use_problem() is not None

    def _record_end(self, run: RunRecord) -> None:
        folder = self.workspace.run_folder(run.id)
        exit_status = processes.recorded_exit_status(folder)
        child = self._children.pop(run.id, None)
        if exit_status is None and child is not None and child.returncode >= 0:
            exit_status = child.returncode
        if run.state == STARTING:  # a server died between taking it and launching it
            state, exit_status, message = "failed", None, "the server stopped while starting it"
        else:
            state, exit_status, message = run_files.ending(folder, exit_status)
        self.queue.mark_ended(run.id, state, exit_status, message)
        logger.info("run %s (%s) ended: %s, exit status %s", run.id, run.name, state, exit_status)

    def _start_queued(self) -> None:
        active = self.queue.in_state(RUNNING, STARTING)
        free = self.slots - len(active)
        # a run STARTING holds no set yet: claimed and launched within this pass only
        free_sets = [d for d in self.devices if d not in {run.devices for run in active}]
        for run in self.queue.in_state(QUEUED)[:max(0, free)]:
            if not self.queue.claim(run.id):
                continue  # cancelled meanwhile
            devices = free_sets.pop(0) if free_sets else None
            env = None if devices is None else {**os.environ, "CUDA_VISIBLE_DEVICES": devices}
            try:
                child = processes.launch(self.repo, self.workspace.run_folder(run.id), env)
            except OSError as exc:  # no bash, a full disk for console.log
                self.queue.mark_ended(run.id, "failed", None, f"could not start it: {exc}")
                continue
            self._children[run.id] = child
            self.queue.mark_running(run.id, child.pid, processes.process_start(child.pid),
                                    devices)
            logger.info("started run %s (%s) as process group %d%s", run.id, run.name,
                        child.pid, "" if devices is None else f" on GPUs {devices}")
