"""The model families, one folder each (`simpletuner/families/<model_family>/`), found by name:
a folder with a spec.py is a family. Nothing is imported until a family is asked for, and
spec modules are torch-free, so asking costs no model library."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from simpletuner.families.spec import FLOW, FamilySpec

SPEC_MODULE = "spec"


def family_names() -> tuple[str, ...]:
    """Every family, by folder name, sorted."""
    here = Path(__file__).parent
    return tuple(sorted(folder.name for folder in here.iterdir()
                        if (folder / f"{SPEC_MODULE}.py").is_file()
                        and not folder.name.startswith("_")))


def family_spec(name: str) -> FamilySpec:
    """The spec of family ``name``; ValueError naming the known ones when there is none."""
    known = family_names()
    if name not in known:
        raise ValueError(f"model_family {name!r} has no adapter; known: " + ", ".join(known))
    return _spec_of(name)


def family_specs() -> tuple[FamilySpec, ...]:
    return tuple(_spec_of(name) for name in family_names())


def _spec_of(name: str) -> FamilySpec:
    """The SPEC of the folder ``name`` (sys.modules keeps it after the first import)."""
    return import_module(f"{__name__}.{name}.{SPEC_MODULE}").SPEC


def flow_families() -> tuple[str, ...]:
    return tuple(spec.name for spec in family_specs() if spec.objective == FLOW)


def builtin_recipes() -> dict[str, str]:
    """Every built-in tiny model's name (without builtin:) -> its build function's path."""
    return {name: build for spec in family_specs() for name, build in spec.tiny_models.items()}


def load_object(path: str):
    """The object a spec names by "module.name" (an adapter class, a build function)."""
    module_name, _, name = path.rpartition(".")
    return getattr(import_module(module_name), name)


def spoken_list(names, quote: str = "") -> str:
    """'a, b and c' (each name in ``quote``s), as messages list families."""
    quoted = [f"{quote}{name}{quote}" for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]
