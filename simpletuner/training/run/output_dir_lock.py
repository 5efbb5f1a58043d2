"""One run per output_dir: a lock naming the run that holds it (the refusal of a fresh start
over an earlier run's checkpoints is in launch_checks.py: it needs no lock and no collective).
Files only, no collective: output_dir_claim.py takes the lock for a run of many ranks, and
``python -m simpletuner check`` looks at it before launch without taking it.

The lock is `output_dir/.simpletuner.lock`, JSON naming the holder's pid, host and start time.
Only the global main process takes it, before any heavy work, and removes it when the run ends
however it ends (a killed run leaves it behind: on the same host it is taken over once its pid
is gone). Every rank learns whether it was taken, so every rank stops with the same message.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from simpletuner.common.atomic import atomic_write_json

logger = logging.getLogger(__name__)

LOCK_NAME = ".simpletuner.lock"


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), so a pid reused by a
    later process (a restarted container) is not taken for the lock's holder. None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # the name in parentheses may hold spaces


@dataclass(frozen=True)
class LockOwner:
    pid: int
    host: str
    started: str                 # ISO 8601, UTC
    process_start: str | None    # see _process_start

    @classmethod
    def this_process(cls) -> LockOwner:
        return cls(os.getpid(), socket.gethostname(),
                   datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   _process_start(os.getpid()))

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}"

    def gone_because(self) -> str | None:
        """Why this host can tell the holder no longer runs (said in the takeover warning), or
        None when it may still run (or runs on another host)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return "it no longer runs"
        except PermissionError:
            pass  # alive, another user's
        running_start = _process_start(self.pid)
        if self.process_start is None or running_start is None:
            return None
        if running_start == self.process_start:
            return None
        return f"a different process now uses pid {self.pid} (it started later)"

    @classmethod
    def from_json(cls, value) -> LockOwner:
        """Raise ValueError naming what is wrong unless ``value`` is what this_process wrote."""
        if not isinstance(value, dict):
            raise ValueError(f"a JSON {type(value).__name__}, not an object")
        keys = {field.name for field in fields(cls)}
        if set(value) != keys:
            missing, extra = sorted(keys - set(value)), sorted(set(value) - keys)
            raise ValueError("; ".join(f"{what} {', '.join(names)}" for what, names in
                                       (("missing", missing), ("unexpected", extra)) if names))
        owner = cls(**value)
        if (type(owner.pid) is not int or not isinstance(owner.host, str)
                or not isinstance(owner.started, str)
                or not isinstance(owner.process_start, (str, type(None)))):
            raise ValueError("values of other types than this trainer writes")
        return owner


class OutputDirLock:
    """The lock file of one output_dir, as seen by this process."""

    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_NAME
        self.owner = LockOwner.this_process()

    def try_acquire(self) -> str | None:
        """Take the lock; return None when taken, otherwise why not and what to do."""
        try:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            if self._create():
                return None
            holder = self._read_holder()
            gone_because = holder.gone_because() if holder is not None else None
            if holder is None or gone_because is not None:
                if holder is not None:
                    self._remove_stale(holder, gone_because)
                if self._create():
                    return None
                holder = self._read_holder()  # another run was quicker
        except ValueError as exc:
            return self._unreadable(exc)
        except OSError as exc:
            return (f"cannot write the run's lock file {self.path} ({exc.strerror or exc}); "
                    "choose a folder you can write to")
        return self._in_use(holder)

    def in_use_problem(self) -> str | None:
        """Without taking the lock: why try_acquire would refuse it to a run starting now, as
        far as the lock file shows (check runs this before launch; the preflight checks that
        output_dir is writable on every rank)."""
        try:
            holder = self._read_holder()
        except ValueError as exc:
            return self._unreadable(exc)
        except OSError as exc:
            return (f"cannot read the run's lock file {self.path} ({exc.strerror or exc}); "
                    "fix its permissions or choose another output_dir")
        if holder is None or holder.gone_because() is not None:
            return None
        return self._in_use(holder)

    def _unreadable(self, exc: ValueError) -> str:
        return f"{exc}; if no run is using {self.output_dir}, delete that file"

    def _in_use(self, holder: LockOwner | None) -> str:
        who = holder.describe() if holder is not None else "a run that just ended"
        return (f"output_dir {self.output_dir} is in use by another run ({who}; lock file "
                f"{self.path}). Wait for that run to end or use another output_dir; if no run "
                "is using it, delete the lock file")

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        try:
            holder = self._read_holder()
            if holder == self.owner:
                self.path.unlink()
            elif holder is not None:
                logger.warning("not removing %s: it now names %s", self.path, holder.describe())
        except (OSError, ValueError) as exc:
            logger.warning("could not remove the output_dir lock %s: %s", self.path, exc)

    def _remove_stale(self, holder: LockOwner, gone_because: str) -> None:
        """Two runs on one host that found the same stale lock must not both take it: the
        second to get the flock finds the lock changed (or gone) and leaves it."""
        with open(self.path.with_name(f"{LOCK_NAME}.takeover"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file closes
            if self._read_holder() == holder:
                logger.warning("output_dir lock %s was left by %s; %s; taking it over",
                               self.path, holder.describe(), gone_because)
                self.path.unlink()

    def _read_holder(self) -> LockOwner | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return LockOwner.from_json(json.loads(data))
        except ValueError as exc:  # not JSON (UnicodeDecodeError is one), or not our shape
            raise ValueError(f"{self.path} is not a lock this trainer wrote ({exc})") from exc

    def _create(self) -> bool:
        """Write our JSON under a private name, then link it into place: the link either
        fails (someone holds the lock, on any host of a shared filesystem) or shows a complete
        file."""
        private = self.output_dir / f"{LOCK_NAME}.{self.owner.host}.{self.owner.pid}"
        atomic_write_json(private, asdict(self.owner), indent=1)
        try:
            os.link(private, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            private.unlink()

