"""The test files themselves: each ends with its unittest.main() guard (a class after it would
not run under `python tests/test_x.py`), and every process a test starts goes through
tests/launching.py (bounded, its own session, a private TMPDIR, nothing left running)."""

from __future__ import annotations

import ast
import unittest
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LAUNCHING = TESTS / "launching.py"
STARTERS = {("subprocess", name) for name in ("Popen", "run", "call", "check_call",
                                               "check_output", "getoutput", "getstatusoutput")}
STARTERS |= {("os", name) for name in ("system", "popen", "fork", "forkpty", "execv", "execve",
                                       "spawnv", "spawnve", "posix_spawn", "posix_spawnp")}


def is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def process_starts(tree: ast.Module) -> list[str]:
    """``module.function`` for each use of a process-starting function, and each import of one."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and (node.value.id, node.attr) in STARTERS):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os"):
            found += [f"line {node.lineno}: from {node.module} import {alias.name}"
                      for alias in node.names if (node.module, alias.name) in STARTERS]
    return found


class TestFilesTest(unittest.TestCase):
    def test_every_test_file_ends_with_its_main_guard(self):
        for path in sorted(TESTS.glob("test_*.py")):
            body = ast.parse(path.read_text()).body
            guards = [i for i, node in enumerate(body) if is_main_guard(node)]
            self.assertEqual(guards, [len(body) - 1], f"{path.name}: the guard is not last")

    def test_only_launching_starts_processes(self):
        for path in sorted(TESTS.glob("*.py")):
            if path != LAUNCHING:
                starts = process_starts(ast.parse(path.read_text()))
                self.assertEqual(starts, [], f"{path.name}: start it with tests/launching.py")

    def test_the_checks_see_what_they_look_for(self):
        starts = process_starts(ast.parse(
            "import subprocess, os\nfrom subprocess import Popen\n"
            "subprocess.run(['true'])\nos.system('true')\nprobe.subprocess.Popen\n"))
        self.assertCountEqual(starts, ["line 2: from subprocess import Popen",
                                       "line 3: subprocess.run", "line 4: os.system"])
        self.assertTrue(is_main_guard(ast.parse('if __name__ == "__main__":\n    pass').body[0]))


if __name__ == "__main__":
    unittest.main()
