"""tests/launching.py: a launch that outlives its timeout takes every process it started with it,
whether that process ignores SIGTERM, left the group or left the session; a launch that ends
gives back its status and all its output and leaves nothing running."""

from __future__ import annotations

import shutil
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path

from launching import Launch, private_tmpdir, run_bounded

# The command: starts a grandchild that ignores SIGTERM and sleeps (in a session of its own
# when asked, as torchrun starts its workers), says so, then sleeps itself.
PARENT = textwrap.dedent("""
    import subprocess, sys
    grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                                  start_new_session=sys.argv[3] == "own-session")
    print("started the grandchild", flush=True)
    import time; time.sleep(600)
""")
GRANDCHILD = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(sys.argv[1] + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    time.sleep(600)
""")


def running(pid: int) -> bool:
    """A zombie has ended: it only waits for a parent (maybe a non-reaping init) to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_file(path: Path, limit: float = 30) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {limit} s")
        time.sleep(0.05)


class LaunchingTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-launching-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.pid_file = self.tmp / "grandchild.pid"

    def command(self, session: str) -> list[str]:
        return [sys.executable, "-c", PARENT, GRANDCHILD, str(self.pid_file), session]

    def grandchild(self) -> int:
        return int(self.pid_file.read_text())

    def check_timeout_kills_the_grandchild(self, session: str) -> None:
        with self.assertRaises(AssertionError) as caught:
            run_bounded(self.command(session), tmpdir=self.tmp, timeout=8)
        report = str(caught.exception)
        self.assertIn("did not end within 8 s", report)
        self.assertIn("started the grandchild", report)  # the end of its stdout
        self.assertFalse(running(self.grandchild()), f"grandchild {self.grandchild()} survived")

    def test_a_timeout_kills_a_grandchild_that_ignores_sigterm(self):
        self.check_timeout_kills_the_grandchild("same-session")

    def test_a_timeout_kills_a_grandchild_in_a_session_of_its_own(self):
        self.check_timeout_kills_the_grandchild("own-session")

    def test_a_launch_lists_its_processes_and_leaving_it_kills_them(self):
        with Launch(self.command("own-session"), tmpdir=self.tmp) as run:
            wait_for_file(self.pid_file)
            self.assertEqual(sorted(run.processes()), sorted([run.pid, self.grandchild()]))
            with self.assertRaises(AssertionError):
                run.wait(timeout=0.5)
            self.assertIsNotNone(run.process.returncode)  # reaped
        self.assertFalse(running(self.grandchild()))

    def test_a_finished_command_gives_its_status_output_and_private_tmpdir(self):
        script = ("import os, sys; print(os.environ['TMPDIR']); "
                  "print('to stderr', file=sys.stderr); sys.exit(3)")
        result = run_bounded([sys.executable, "-c", script], tmpdir=self.tmp, timeout=30,
                             env={"PATH": "/usr/bin:/bin", "TMPDIR": "/elsewhere"})
        self.assertEqual((result.returncode, result.stdout, result.stderr),
                         (3, f"{self.tmp}\n", "to stderr\n"))

    def test_output_larger_than_a_pipe_holds_neither_blocks_nor_is_cut(self):
        script = "import sys; sys.stdout.write('o' * 10**6); sys.stderr.write('e' * 10**6)"
        result = run_bounded([sys.executable, "-c", script], tmpdir=self.tmp, timeout=30)
        self.assertEqual((result.stdout, result.stderr), ("o" * 10**6, "e" * 10**6))

    def test_what_a_finished_command_left_running_is_killed(self):
        script = ("import subprocess, sys; print(subprocess.Popen("
                  "[sys.executable, '-c', 'import time; time.sleep(600)']).pid)")
        result = run_bounded([sys.executable, "-c", script], tmpdir=self.tmp, timeout=30)
        self.assertEqual(result.returncode, 0, result.stderr)
        # SIGKILL was sent; the kernel tears the process down after the call returns (its
        # environment already unreadable, its state not yet a zombie's): give that a moment.
        orphan, deadline = int(result.stdout), time.monotonic() + 10
        while running(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(running(orphan))

    def test_the_shared_temporary_folder_is_refused(self):
        with self.assertRaises(ValueError):
            private_tmpdir(tempfile.gettempdir())
        self.assertEqual(private_tmpdir(self.tmp), str(self.tmp))


if __name__ == "__main__":
    unittest.main()
