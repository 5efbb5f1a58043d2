"""The one error type a configuration problem raises: it carries every problem found, each a
``Problem`` record that names its file, the JSON path of the value and the key.

JSON paths: config.json's options by name (``learning_rate``); the dataset file's entries as
``datasets[<index>]`` followed by their keys (``datasets[1].video.num_frames``), the list
itself as ``datasets``; an empty path is the file as a whole. Command-line overrides have the
file ``command line``, environment variables ``environment`` (their path is the variable's
name). ``fix`` is what to do, where a check says it apart from the message; the text report
joins them with "; ".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

DATASETS = "datasets"  # the JSON path of the dataset file's list


@dataclass(frozen=True)
class Problem:
    """One configuration problem. ``shown_at`` is how the text report names where it is
    (the file, and for a dataset its index and id), so that report reads as it always has."""

    file: str
    path: str
    key: str
    message: str
    fix: str = ""
    shown_at: str = field(default="", repr=False)

    def __str__(self) -> str:
        text = f"{self.message}; {self.fix}" if self.fix else self.message
        return f"{self.shown_at}: {text}" if self.shown_at else text

    def as_json(self) -> dict[str, str]:
        return {"file": self.file, "path": self.path, "key": self.key, "message": self.message,
                "fix": self.fix}


@dataclass(frozen=True)
class Location:
    """Where a checked object is: its file, its JSON path, and how the text report names it
    (``shown``: the file name unless given). Checks take one and build their records with it."""

    file: str
    path: str = ""
    shown: str | None = None
    entry_ids: tuple[object, ...] = ()  # the dataset file's: each entry's id, in file order

    def __str__(self) -> str:
        return self.file if self.shown is None else self.shown

    def key_path(self, key: str) -> str:
        """The JSON path of ``key`` (itself a path, e.g. ``video.num_frames``) in this object."""
        if not key:
            return self.path
        if not self.path or key.startswith("["):
            return f"{self.path}{key}"
        return f"{self.path}.{key}"

    def problem(self, key: str, message: str, fix: str = "") -> Problem:
        """A problem with ``key`` of this object ("" for the object itself)."""
        path = self.key_path(key)
        return Problem(file=self.file, path=path, key=_last_key(path), message=message,
                       fix=fix, shown_at=str(self))

    def within(self, key: str, shown: str) -> Location:
        """The object at ``key`` in this one; the report names it ``<this>: <shown>``."""
        return Location(self.file, self.key_path(key), f"{self}: {shown}")

    def entry(self, dataset_id: str, shown: str | None = None) -> Location:
        """The dataset file's entry with this id (checks after parsing know datasets by id);
        the report names it ``<this>: <shown>``, or as this location without ``shown``."""
        index = self.entry_ids.index(dataset_id) if dataset_id in self.entry_ids else None
        path = self.key_path("" if index is None else f"[{index}]")
        return Location(self.file, path, str(self) if shown is None else f"{self}: {shown}")


def _last_key(path: str) -> str:
    """The key a path ends in: '' for the file, the dataset list or one of its entries."""
    last = path.rsplit(".", 1)[-1]
    return "" if last == DATASETS or last.endswith("]") else last


class ConfigError(ValueError):
    """Raised with all problems at once. ``records`` are the Problems; ``problems`` their lines
    as the text report prints them. A problem given as text is one found while a run starts
    (in the data, or on another rank) that names no file or key of its own."""

    def __init__(self, records: Sequence[Problem | str]):
        self.records = [record if isinstance(record, Problem) else Problem("", "", "", record)
                        for record in records]
        self.problems = [str(record) for record in self.records]
        count = len(self.problems)
        header = f"{count} configuration problem{'s' if count != 1 else ''}:"
        super().__init__("\n".join([header] + [f"  - {p}" for p in self.problems]))
