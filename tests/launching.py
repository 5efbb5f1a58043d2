"""Every process a test starts goes through here: in a session of its own, with a private
TMPDIR, its stdout and stderr drained into memory as they come (no pipe fills; not files,
which a test's RLIMIT_FSIZE would cut), and bounded by a timeout after which every process it
started is killed and the test fails with the end of its output.

"Every process it started" is more than its process group: torchrun starts each worker in a
session of its own and ./train.sh gives the launcher its own group, so a launch is also found
by a marker in the environment, which every descendant inherits whatever its session or parent.

    result = run_bounded(command, tmpdir=tmp, timeout=120, env=env)  # CompletedProcess
    with Launch(command, tmpdir=tmp, env=env) as run:                 # for signals and polls
        ...
        status = run.wait(timeout=120)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
MARKER = "TEST_LAUNCH_ID"
KILL_WAIT_S = 10
OUTPUT_TAIL = 4000


def private_tmpdir(tmpdir: str | Path) -> str:
    """``tmpdir`` as a string, refused when it is the shared temporary folder itself."""
    if Path(tmpdir).resolve() == Path(tempfile.gettempdir()).resolve():
        raise ValueError(f"{tmpdir} is the shared temporary folder: give the launch its own")
    return str(tmpdir)


def marked_processes(launch_id: str) -> list[int]:
    """Live processes whose environment carries ``launch_id`` (a zombie's cannot be read)."""
    entry = f"{MARKER}={launch_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
        except OSError:  # ended, a zombie, or another user's
            continue
        if entry in environ.split(b"\0"):
            found.append(int(name))
    return found


def sigkill(send, target: int) -> None:
    """``send`` (os.kill or os.killpg) SIGKILL to ``target``."""
    try:
        send(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone (a group whose members all ended cannot be signalled)


class Drained:
    """A pipe read by a thread of its own until every writer has closed it."""

    def __init__(self, pipe: IO[bytes]):
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._thread.start()

    def _drain(self, pipe: IO[bytes]) -> None:
        with pipe:
            while chunk := pipe.read1():
                self._chunks.append(chunk)

    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def join(self) -> None:
        self._thread.join(KILL_WAIT_S)


class Launch:
    """``command`` started in a new session under ``cwd``, with ``env`` (default: this
    process's) and TMPDIR=``tmpdir``. Leaving the ``with`` block (or ``close``) kills whatever
    of it still runs, then reaps it; ``process`` is the Popen, for polls and signals. Its
    output is complete once it is closed or a wait has timed out."""

    def __init__(self, command: Sequence[str | os.PathLike], *, tmpdir: str | Path,
                 env: Mapping[str, str] | None = None, cwd: str | Path = REPO):
        self.command = [str(part) for part in command]
        self.launch_id = uuid.uuid4().hex
        tmp = private_tmpdir(tmpdir)
        full_env = {**(os.environ if env is None else env), "TMPDIR": tmp,
                    MARKER: self.launch_id}
        # ./train.sh runs `python`: this interpreter's, also when its venv is not activated
        # (`venv/bin/python -m unittest discover -s tests`).
        full_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent),
                                            full_env.get("PATH", os.defpath)])
        # One torch thread, as conftest.py sets under pytest: a run and its resumed twin launched
        # differently (./train.sh, python -m) then agree bit for bit under unittest too.
        full_env.setdefault("OMP_NUM_THREADS", "1")
        self.process = subprocess.Popen(
            self.command, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._stdout, self._stderr = Drained(self.process.stdout), Drained(self.process.stderr)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stdout(self) -> str:
        """What it wrote to stdout so far."""
        return self._stdout.text()

    def stderr(self) -> str:
        """What it wrote to stderr so far."""
        return self._stderr.text()

    def processes(self) -> list[int]:
        """The pids of this launch still running: the command and everything it started."""
        return marked_processes(self.launch_id)

    def wait(self, timeout: float) -> int:
        """The command's exit status; past ``timeout`` seconds, everything it started is killed
        and the test fails with the end of its output."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(self._timeout_report(timeout)) from None

    def _timeout_report(self, timeout: float) -> str:
        return (f"{' '.join(self.command)[:300]}\ndid not end within {timeout:.0f} s; every "
                f"process it started was killed.\n--- end of its stdout ---\n"
                f"{self.stdout()[-OUTPUT_TAIL:]}\n--- end of its stderr ---\n"
                f"{self.stderr()[-OUTPUT_TAIL:]}")

    def close(self) -> None:
        """SIGKILL to the session's group and to every marked process, repeated until none is
        left (one may fork between a look and the kill), then reap the command and read its
        output to the end. The group only while the command is unreaped: until then no other
        process can hold its number."""
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            if self.process.returncode is None:
                sigkill(os.killpg, self.pid)
            left = self.processes()
            for pid in left:
                sigkill(os.kill, pid)
            if not left:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {left} of {self.command[:3]} survive SIGKILL")
            time.sleep(0.05)
        self.process.wait()
        self._stdout.join()
        self._stderr.join()

    def __enter__(self) -> "Launch":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def run_bounded(command: Sequence[str | os.PathLike], *, tmpdir: str | Path, timeout: float,
                env: Mapping[str, str] | None = None,
                cwd: str | Path = REPO) -> subprocess.CompletedProcess:
    """Run ``command`` to its end (see ``Launch``) and return its status and text output;
    past ``timeout`` seconds the test fails (AssertionError) with the end of that output."""
    with Launch(command, tmpdir=tmpdir, env=env, cwd=cwd) as launch:
        status = launch.wait(timeout)
    return subprocess.CompletedProcess(launch.command, status, launch.stdout(), launch.stderr())
