"""The sample lists a sampler state carries, so a resume on changed data can name the files.

Per dataset and bucket the sample ids are grouped by folder: ``{folder: [file names]}``, so a
folder path is stored once, not once per file: about half the JSON of the plain list, quick to
write and read back; front-coding every id saved a little more but was much slower in Python,
on every rank (figures: benchmarks/PERFORMANCE.md). Plain JSON, no compression library.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from simpletuner.helpers.metadata.index import DatasetIndex

NAMED_PER_KIND = 10  # files named per kind of change; the rest are counted


def group_by_folder(sample_ids: Sequence[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for sample_id in sample_ids:
        folder, _, name = sample_id.rpartition("/")
        grouped.setdefault(folder, []).append(name)
    return grouped


def ungroup(grouped: Mapping[str, Sequence[str]]) -> list[str]:
    return [f"{folder}/{name}" if folder else name
            for folder, names in grouped.items() for name in names]


def sample_lists(indexes: Sequence[DatasetIndex]) -> dict[str, dict[str, dict[str, list[str]]]]:
    """dataset id -> bucket -> folder -> file names."""
    return {index.dataset_id: {key: group_by_folder(ids)
                               for key, ids in sorted(index.buckets.items())}
            for index in indexes}


def _bucket_of(buckets: Mapping[str, Sequence[str]]) -> dict[str, str]:
    return {sample_id: key for key, ids in buckets.items() for sample_id in ids}


def _named(kind: str, items: list[str]) -> str:
    more = len(items) - NAMED_PER_KIND
    names = ", ".join(items[:NAMED_PER_KIND]) + (f" and {more} more" if more > 0 else "")
    return f"{len(items)} {kind} ({names})"


def describe_sample_changes(saved: Mapping[str, Mapping[str, Mapping[str, Sequence[str]]]],
                            indexes: Sequence[DatasetIndex]) -> list[str]:
    """One line per dataset (present then and now) whose files were added, removed or moved
    to another bucket since ``saved`` (a ``sample_lists`` value)."""
    lines = []
    for index in sorted(indexes, key=lambda i: i.dataset_id):
        if index.dataset_id not in saved:
            continue
        before = _bucket_of({k: ungroup(v) for k, v in saved[index.dataset_id].items()})
        now = _bucket_of(index.buckets)
        added = sorted(set(now) - set(before))
        removed = sorted(set(before) - set(now))
        moved = sorted(f"{s} {before[s]} -> {now[s]}" for s in set(now) & set(before)
                       if now[s] != before[s])
        parts = [_named(kind, items) for kind, items in
                 (("added", added), ("removed", removed), ("moved to another bucket", moved))
                 if items]
        if parts:
            lines.append(f"dataset '{index.dataset_id}' files: " + "; ".join(parts))
    return lines
