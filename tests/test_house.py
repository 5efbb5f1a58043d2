"""The house's rules, checked on the code itself: a family is one folder (no module outside
simpletuner/families/ names one), and no import closes a circle."""

from __future__ import annotations

import ast
import unittest
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simpletuner"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported(path: Path, known: set[str]) -> set[str]:
    """The package's modules ``path`` imports (``from a import b`` names a.b when that is a
    module), wherever the import statement stands."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names & known


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done, path = [], set(), []

    def visit(module: str) -> None:
        path.append(module)
        for target in sorted(graph[module]):
            if target in path:
                found.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
    return found


class HouseTest(unittest.TestCase):
    def test_no_import_closes_a_circle(self):
        known = modules()
        graph = {name: imported(path, set(known)) - {name} for name, path in known.items()}
        self.assertEqual([" -> ".join(c) for c in cycles(graph)], [])

    def test_no_family_is_named_outside_its_folder(self):
        families = {p.name for p in (PACKAGE / "families").iterdir()
                    if p.is_dir() and not p.name.startswith("_")}
        self.assertGreaterEqual(len(families), 10)
        named = []
        for path in sorted(PACKAGE.rglob("*.py")):
            inside = path.relative_to(PACKAGE).parts[0] == "families"
            if inside or path.name.startswith("demo_"):
                continue
            named += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}"
                      for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                      if isinstance(node, ast.Constant) and node.value in families]
        self.assertEqual(named, [])


if __name__ == "__main__":
    unittest.main()
