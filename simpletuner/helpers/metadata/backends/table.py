"""Metadata backend 'parquet': image sizes (and captions) from a table, no image opened.

SimpleTuner's ``parquet`` block names the table (.parquet, or .jsonl with one object a line)
and its columns. Each row names a file in the storage; a row that cannot be used is reported
with its row number and what is wrong, and skipped: an empty file name, a size that is not a
positive whole number, a file the storage does not hold, a second row for the same file, no
caption for caption_strategy 'parquet'. Listed images without a row are reported too. The
result is the same FileTable header probes give, so the index is the one discovery builds.
"""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

from simpletuner.helpers.data_backend.storage import Listing, Storage
from simpletuner.helpers.metadata.backends.headers import FoundFiles
from simpletuner.helpers.metadata.file_table import FileTable
from simpletuner.helpers.metadata.index import SkippedFile


class TableFormatError(ValueError):
    """The table cannot be read or lacks a named column."""


def read_columns(path: Path, names: list[str]) -> dict[str, list]:
    """The named columns of a .parquet or .jsonl table as Python lists (row i at index i)."""
    if path.suffix.lower() == ".jsonl":
        columns, present = _read_jsonl(path, names)
    else:
        columns, present = _read_parquet(path, names)
    missing = [name for name in names if name not in present]
    if missing:
        raise TableFormatError(
            f"metadata table {path}: no column {', '.join(map(repr, missing))} (it has "
            f"{', '.join(present)}); fix the parquet block's *_column keys")
    return columns


def _read_parquet(path: Path, names: list[str]) -> tuple[dict[str, list], list[str]]:
    import pyarrow  # the 'parquet' extra
    import pyarrow.parquet

    try:
        present = pyarrow.parquet.read_schema(path).names
        if not set(names) <= set(present):
            return {}, present
        table = pyarrow.parquet.read_table(path, columns=names)
    except (OSError, pyarrow.ArrowException) as exc:
        raise TableFormatError(f"metadata table {path}: cannot be read ({exc})") from exc
    return {name: table.column(name).to_pylist() for name in names}, present


def _read_jsonl(path: Path, names: list[str]) -> tuple[dict[str, list], list[str]]:
    """One object a line, parsed line by line: a line with a value of the wrong type (or no
    JSON at all) is one bad row to report, not a table that cannot be read."""
    columns: dict[str, list] = {name: [] for name in names}
    present: dict[str, None] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TableFormatError(f"metadata table {path}: cannot be read ({exc})") from exc
    for line in lines:
        try:
            row = json.loads(line) if line.strip() else {}
        except ValueError:
            row = {}
        if not isinstance(row, dict):
            row = {}
        present.update(dict.fromkeys(row))
        for name in names:
            columns[name].append(row.get(name))
    return columns, list(present)


def _positive_whole(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


class TableSource:
    """``metadata_backend: parquet``."""

    def __init__(self, storage: Storage, dataset):
        self.storage = storage
        self.config = dataset.parquet_config()
        self.path = Path(self.config.path)
        self.wants_captions = dataset.caption_strategy == "parquet"

    def key(self) -> dict:
        """The table's identity: a new or edited table rebuilds the index."""
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            raise TableFormatError(f"metadata table {self.path}: cannot be read "
                                   f"({exc.strerror}); check parquet.path") from exc
        c = self.config
        return {"metadata_backend": "parquet", "table": [str(self.path), stat.st_size,
                                                         stat.st_mtime_ns],
                "columns": [c.filename_column, c.width_column, c.height_column,
                            c.caption_column, c.fallback_caption_column,
                            c.identifier_includes_extension]}

    def read(self, listing: Listing, known: FileTable, show_progress: bool) -> FoundFiles:
        c = self.config
        names = [c.filename_column, c.width_column, c.height_column]
        if self.wants_captions:
            names += [n for n in (c.caption_column, c.fallback_caption_column) if n]
        columns = read_columns(self.path, list(dict.fromkeys(names)))
        count = len(listing.sample_ids)
        files = FileTable(listing.sample_ids, listing.sizes, listing.change_keys,
                          [0] * count, [0] * count)
        rows_of = self._resolver(listing)
        skipped: list[SkippedFile] = []
        captions: dict[str, str] = {}
        seen: dict[str, int] = {}
        captions_of = self._captions(columns, len(columns[c.filename_column]))
        for row, (name, width, height, caption) in enumerate(zip(
                columns[c.filename_column], columns[c.width_column], columns[c.height_column],
                captions_of)):
            where = f"{self.path} row {row}"
            if not isinstance(name, str) or not name.strip("/"):
                skipped.append(SkippedFile(f"<row {row}>", f"{where}: empty or missing "
                                                           f"{c.filename_column!r}"))
                continue
            sample_id = rows_of(name)
            if sample_id is None:
                skipped.append(SkippedFile(name, f"{where}: no such image in {self.storage.location}"))
                continue
            if sample_id in seen:
                skipped.append(SkippedFile(sample_id, f"{where}: a second row for this file "
                                                      f"(first: row {seen[sample_id]}); ignored"))
                continue
            seen[sample_id] = row
            problem = self._row_problem(width, height, caption)
            index = files.row_of(sample_id)
            if problem:
                files.errors[sample_id] = f"{where}: {problem}"
                continue
            files.widths[index], files.heights[index] = int(width), int(height)
            if self.wants_captions:
                captions[sample_id] = caption
        for sample_id in listing.sample_ids:
            if sample_id not in seen:
                files.errors[sample_id] = f"no row in the metadata table {self.path}"
        return FoundFiles(files, 0, 0, skipped, captions if self.wants_captions else None)

    def _captions(self, columns: dict[str, list], count: int) -> list[str | None]:
        """Each row's caption: caption_column, else fallback_caption_column where empty."""
        c = self.config
        if not self.wants_captions:
            return [None] * count
        primary = columns[c.caption_column]
        fallback = columns[c.fallback_caption_column] if c.fallback_caption_column else primary
        return [p.strip() if isinstance(p, str) and p.strip() else
                (f.strip() if isinstance(f, str) and f.strip() else None)
                for p, f in zip(primary, fallback)]

    def _row_problem(self, width, height, caption) -> str | None:
        c = self.config
        if _positive_whole(width) is None or _positive_whole(height) is None:
            return (f"{c.width_column!r} x {c.height_column!r} is {width!r} x {height!r}; "
                    "expected positive whole numbers of pixels")
        if self.wants_captions and caption is None:
            fallback = f" and {c.fallback_caption_column!r}" if c.fallback_caption_column else ""
            return f"empty {c.caption_column!r}{fallback} (caption_strategy 'parquet')"
        return None

    def _resolver(self, listing: Listing):
        """file name in the table -> listed sample id (None: not in storage)."""
        listed = set(listing.sample_ids)
        if self.config.identifier_includes_extension:
            def resolve(name: str) -> str | None:
                name = name.lstrip("/")
                return name if name in listed else None
            return resolve
        by_stem = {posixpath.splitext(s)[0]: s for s in reversed(listing.sample_ids)}

        def resolve_stem(name: str) -> str | None:
            return by_stem.get(name.lstrip("/"))
        return resolve_stem
