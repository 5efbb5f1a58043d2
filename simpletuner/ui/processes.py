"""A run's process: ./train.sh with the run's config, from the repository root, as the leader
of a process group of its own (so the server's death leaves it training), its output appended
to the run's console.log. A small bash wrapper, in the same group, writes train.sh's exit
status to the run's `exit_status` file: a server restarted after the run ended still learns
the status exactly (a configuration error, 2, leaves no training_status.json)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

CONSOLE_NAME = "console.log"
EXIT_STATUS_NAME = "exit_status"

# The wrapper survives the stop signal the group gets (`trap :`; train.sh still receives it,
# since a trapped signal is reset to its default in children) and records the status
# atomically once train.sh has returned.
_WRAPPER = ('trap : TERM INT USR1; "$0" "$1"; status=$?; '
            'echo "$status" > "$2.partial" && mv "$2.partial" "$2"; exit "$status"')


def launch(repo: Path, run_folder: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the run in ``run_folder`` (its config.json) as ./train.sh does."""
    (run_folder / EXIT_STATUS_NAME).unlink(missing_ok=True)
    with open(run_folder / CONSOLE_NAME, "ab") as console:
        return subprocess.Popen(
            ["bash", "-c", _WRAPPER, str(repo / "train.sh"), str(run_folder / "config.json"),
             str(run_folder / EXIT_STATUS_NAME)],
            cwd=repo, env=env, stdin=subprocess.DEVNULL, stdout=console,
            stderr=subprocess.STDOUT, start_new_session=True)


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), which tells the
    run's process from a later one given the same pid; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, *fields = stat.rsplit(")", 1)[1].split()
    return None if state == "Z" else fields[18]  # a zombie has ended


def still_runs(pid: int, started: str | None) -> bool:
    """Whether the process recorded as ``pid`` (started at ``started``) still runs."""
    running_start = process_start(pid)
    return running_start is not None and (started is None or running_start == started)


def stop(pid: int) -> bool:
    """SIGTERM to the run's process group: train.sh forwards it to the training processes,
    which checkpoint at the next step and exit with 75. False when the group is gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def recorded_exit_status(run_folder: Path) -> int | None:
    try:
        return int((run_folder / EXIT_STATUS_NAME).read_text().strip())
    except (OSError, ValueError):
        return None
