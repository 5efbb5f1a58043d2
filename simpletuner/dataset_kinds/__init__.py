"""The dataset kinds, one module each (its name is the ``dataset_type`` value, its ``KIND`` the
record everything else asks). A new kind is one module here."""

from __future__ import annotations

from importlib import import_module
from pathlib import Path

from simpletuner.dataset_kinds.kind import DatasetKind

_NOT_KINDS = {"__init__", "kind"}


def _module_names() -> list[str]:
    return sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem not in _NOT_KINDS)


def kind_names() -> tuple[str, ...]:
    """Every dataset_type value, the default first (the order docs list them in)."""
    return tuple(sorted(_module_names(), key=lambda name: not kind_named(name).is_default))


def kind_named(name: str) -> DatasetKind:
    """A kind by its dataset_type value: its module, imported once by Python (a lookup in
    sys.modules after that, so asking per dataset costs no folder listing)."""
    if not name.isidentifier() or name in _NOT_KINDS:
        raise _unknown(name)
    try:
        return import_module(f"{__name__}.{name}").KIND
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # a kind module's own missing import
        raise _unknown(name) from None


def _unknown(name: str) -> ValueError:
    return ValueError(f"dataset_type {name!r} is not a dataset kind; known: "
                      + ", ".join(kind_names()))


def default_kind() -> DatasetKind:
    """The kind of a dataset that names none (image)."""
    return next(kind for kind in map(kind_named, _module_names()) if kind.is_default)


def kind_of(dataset) -> DatasetKind:
    """The kind of a configuration.DatasetConfig."""
    return kind_named(dataset.dataset_type)
