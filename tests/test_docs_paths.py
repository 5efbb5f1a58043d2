"""The documents that describe the code name only files and folders that exist.

Every backticked path in AGENTS.md, docs/DESIGN.md and benchmarks/PERFORMANCE.md must exist,
and every relative Markdown link in them and in README.md must lead to a file. A path is looked
up from the repository root or from simpletuner/ (the design names modules as
`helpers/metadata/startup.py`); in a table row, also from the folder its first cell names, so a
row for `simpletuner/training/` may list `recipe.py`. A bare file name in prose may name a file
anywhere in the repository. What a run creates (`output_dir/...`) and patterns
(`rank-<k>.jsonl`, `builtin:tiny-*`) are not paths of the repository and are not checked.
"""

from __future__ import annotations

import os
import re
import unittest
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESCRIBED = ("AGENTS.md", "docs/DESIGN.md", "benchmarks/PERFORMANCE.md")
LINKED = ("README.md", *DESCRIBED)

SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH_CHARACTERS = re.compile(r"^[\w.\-/]+$")
FILE_SUFFIXES = (".py", ".md", ".sh", ".toml")  # a bare name with one of these is a repo file
RUN_FOLDERS = ("output_dir/", "output/", "data/", "audit/", "DIR/")  # made by a run, not tracked
SKIPPED_FOLDERS = {".git", "__pycache__", ".venv", ".pytest_cache", "build", "data", "output"}


def repository_names() -> set[str]:
    names = set()
    for _, folders, files in os.walk(ROOT):
        folders[:] = [f for f in folders if f not in SKIPPED_FOLDERS and
                      not f.endswith(".egg-info")]
        names.update(files)
    return names


def is_repository_path(span: str) -> bool:
    if not PATH_CHARACTERS.match(span) or span.startswith(RUN_FOLDERS) or span in (".", ".."):
        return False
    return "/" in span or span.endswith(FILE_SUFFIXES)


def named_paths(text: str) -> Iterator[tuple[int, str, Path | None]]:
    """(line number, path, the table row's folder or None) for every backticked path."""
    for number, line in enumerate(text.splitlines(), start=1):
        base = None
        if line.startswith("|"):
            first_cell = line.strip("|").split("|")[0]
            first = SPAN.search(first_cell)
            if first and is_repository_path(first.group(1)):
                named = ROOT / first.group(1)
                base = named if first.group(1).endswith("/") or named.is_dir() else named.parent
        for match in SPAN.finditer(line):
            if is_repository_path(match.group(1)):
                yield number, match.group(1), base


def exists(span: str, base: Path | None, names: set[str]) -> bool:
    """Inside the repository only: `../shared/DESIGN.md` is not part of a clone."""
    places = [ROOT, ROOT / "simpletuner"] + ([base] if base is not None else [])
    if any((place / span).exists() and (place / span).resolve().is_relative_to(ROOT)
           for place in places):
        return True
    return base is None and "/" not in span and span in names


class DocumentedPathsTest(unittest.TestCase):
    maxDiff = None

    def test_every_backticked_path_exists(self):
        names = repository_names()
        missing = []
        for document in DESCRIBED:
            text = (ROOT / document).read_text(encoding="utf-8")
            missing += [f"{document}:{number}: `{span}`"
                        for number, span, base in named_paths(text)
                        if not exists(span, base, names)]
        self.assertEqual(missing, [], "these documented paths do not exist:\n"
                         + "\n".join(missing))

    def test_every_relative_link_leads_to_a_file(self):
        broken = []
        for document in LINKED:
            path = ROOT / document
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for target in LINK.findall(line):
                    if "://" in target or target.startswith(("#", "mailto:")):
                        continue
                    if not (path.parent / target.split("#")[0]).exists():
                        broken.append(f"{document}:{number}: ({target})")
        self.assertEqual(broken, [], "these links lead nowhere:\n" + "\n".join(broken))

    def test_the_checker_sees_a_missing_path(self):
        """The checks above could pass by finding nothing; they find a path that is not there."""
        found = list(named_paths("see `simpletuner/no_such_module.py`, `plan.json` and "
                                 "`../shared/DESIGN.md`\n"
                                 "| `simpletuner/training/` | `no_such_file.py`, `recipe.py` |"))
        self.assertEqual([span for _, span, _ in found],
                         ["simpletuner/no_such_module.py", "../shared/DESIGN.md",
                          "simpletuner/training/",
                          "no_such_file.py", "recipe.py"])
        names = repository_names()
        self.assertEqual([exists(span, base, names) for _, span, base in found],
                         [False, False, True, False, True])


if __name__ == "__main__":
    unittest.main()
