"""The dataset kinds, one module each (its name is the ``dataset_type`` value, its ``KIND`` the
record everything else asks). A new kind is one module here."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from simpletuner.dataset_kinds.kind import DatasetKind

_NOT_KINDS = {"__init__", "kind"}


def kind_names() -> tuple[str, ...]:
    """Every dataset_type value, the default first (the order docs list them in)."""
    names = sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem not in _NOT_KINDS)
    return tuple(sorted(names, key=lambda name: not kind_named(name).is_default))


def kind_named(name: str) -> DatasetKind:
    if name not in {p.stem for p in Path(__file__).parent.glob("*.py")} - _NOT_KINDS:
        raise ValueError(f"dataset_type {name!r} is not a dataset kind; known: "
                         + ", ".join(kind_names()))
    return import_module(f"{__name__}.{name}").KIND


def default_kind() -> DatasetKind:
    """The kind of a dataset that names none (image)."""
    return next(kind_named(name) for name in kind_names() if kind_named(name).is_default)


def kind_of(dataset) -> DatasetKind:
    """The kind of a configuration.DatasetConfig."""
    return kind_named(dataset.dataset_type)
