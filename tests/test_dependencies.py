"""Every third-party import is declared in pyproject.toml, so a fresh virtualenv installs it.

The package's imports must be in `dependencies` or an extra; the tests' and benchmarks' imports
in `dependencies` or what the `test` extra brings in (extras it names included). A module is
mapped to the distribution that provides it with importlib.metadata, as installed here.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
import unittest
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "simpletuner"


def normalise(name: str) -> str:
    """PEP 503: 'Pillow', 'pillow' and 'PIL_low' name the same distribution family."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalise(re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0])


def declared(pyproject: dict, extra: str | None) -> set[str]:
    """Distributions declared by `dependencies` plus, when ``extra`` is given, that extra and
    the extras of this project it names (``simpletuner[s3]``); every extra when it is "*"."""
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    names = {requirement_name(r) for r in project.get("dependencies", [])}
    pending = list(extras) if extra == "*" else [extra] if extra else []
    seen: set[str] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in extras.get(current, []):
            name = requirement_name(requirement)
            if name == normalise(project["name"]):
                pending.extend(re.findall(r"[\w-]+", requirement.split("[", 1)[1]))
            else:
                names.add(name)
    return names


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def third_party(modules: set[str], local: set[str]) -> set[str]:
    return {m for m in modules
            if m not in sys.stdlib_module_names and m != "__future__" and m != PACKAGE
            and m not in local}


def undeclared_imports(pyproject: dict, folder: Path, extra: str | None) -> list[str]:
    """One line per (file, module) whose distribution ``pyproject`` does not declare."""
    allowed = declared(pyproject, extra)
    providers = packages_distributions()
    local = {p.stem for p in folder.glob("*.py")}
    problems = []
    for path in sorted(folder.rglob("*.py")):
        for module in sorted(third_party(imported_modules(path), local)):
            distributions = {normalise(d) for d in providers.get(module, [])}
            if not distributions & allowed:
                provided = ", ".join(sorted(distributions)) or "no installed distribution"
                problems.append(f"{path.relative_to(REPO)} imports '{module}' ({provided}), "
                                "which pyproject.toml does not declare")
    return problems


def load_pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


class DeclaredDependenciesTest(unittest.TestCase):
    def test_package_imports_are_declared(self):
        problems = undeclared_imports(load_pyproject(), REPO / PACKAGE, extra="*")
        self.assertEqual(problems, [], "\n".join(problems))

    def test_test_and_benchmark_imports_come_with_the_test_extra(self):
        pyproject = load_pyproject()
        problems = (undeclared_imports(pyproject, REPO / "tests", extra="test")
                    + undeclared_imports(pyproject, REPO / "benchmarks", extra="test"))
        self.assertEqual(problems, [], "\n".join(problems))

    def test_test_extra_brings_every_extra(self):
        # The tests exercise every optional feature, so README's one test command must
        # install them all.
        pyproject = load_pyproject()
        self.assertEqual(declared(pyproject, "*") - declared(pyproject, "test"), set())

    def test_a_removed_dependency_is_named_with_the_file_that_imports_it(self):
        pyproject = load_pyproject()
        project = pyproject["project"]
        for requirements in [project["dependencies"], *project["optional-dependencies"].values()]:
            requirements[:] = [r for r in requirements if requirement_name(r) != "peft"]
        problems = undeclared_imports(pyproject, REPO / PACKAGE, extra="*")
        self.assertTrue(
            any("simpletuner/training/adapters/lora.py imports 'peft'" in p for p in problems),
            problems)

    def test_extras_named_by_another_extra_are_followed(self):
        pyproject = {"project": {"name": "simpletuner", "dependencies": ["torch>=2"],
                                 "optional-dependencies": {
                                     "s3": ["boto3>=1.34"],
                                     "test": ["pytest>=8", "simpletuner[s3]"]}}}
        self.assertEqual(declared(pyproject, "test"), {"torch", "pytest", "boto3"})
        self.assertEqual(declared(pyproject, None), {"torch"})


if __name__ == "__main__":
    unittest.main()
