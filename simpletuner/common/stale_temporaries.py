"""Temporary files that atomic writers (atomic.py) leave when killed mid-write (SIGKILL, out of
memory, a lost machine): the rename never came, and nothing else would ever remove them (an
index cache's is as large as the cache). The next writer into the folder removes them.

A temporary's name carries its writer: ``.<target>.<host>-<pid>-<random>.tmp``. One whose
writer was on this host and is gone is removed at once; a writer elsewhere (a shared
filesystem) cannot be asked, so its file, like one named before names carried the writer, is
removed once it has not been written for a day: no writer pauses that long mid-file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
from pathlib import Path

logger = logging.getLogger(__name__)

HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
UNOWNED_AFTER_S = 24 * 3600
_WITH_WRITER = re.compile(r"^\..+\.([0-9a-f]{8})-(\d+)-[0-9a-f]{12}\.tmp$")
_WITHOUT_WRITER = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # atomic.py's earlier names


def temporary_prefix(target_name: str) -> str:
    """The start of a temporary's name for ``target_name``, written by this process."""
    return f".{target_name}.{HOST_TAG}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _is_stale(entry: os.DirEntry, now: float) -> bool:
    named = _WITH_WRITER.match(entry.name)
    if named and named.group(1) == HOST_TAG:
        return not _alive(int(named.group(2)))
    if named or _WITHOUT_WRITER.match(entry.name):
        return now - entry.stat(follow_symlinks=False).st_mtime > UNOWNED_AFTER_S
    return False


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the stale temporaries in ``folder`` (not below it), naming each in the log;
    returns what was removed. Never fatal: a folder that cannot be read or written is the
    write's own problem, reported by the write."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:  # missing (nothing written yet) or unreadable
        return removed
    for entry in entries:
        try:
            if not (entry.is_file(follow_symlinks=False) and _is_stale(entry, now)):
                continue
            os.unlink(entry.path)
        except FileNotFoundError:  # its writer finished (or another run removed it)
            continue
        except OSError as exc:
            logger.warning("could not remove %s, left by a writer that was stopped: %s",
                           entry.path, exc.strerror or exc)
            continue
        removed.append(Path(entry.path))
        logger.info("removed %s, left by a writer that was stopped mid-write", entry.path)
    return removed
