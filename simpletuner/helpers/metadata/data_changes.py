"""What changed in a dataset between two versions of its index cache, named file by file.

A resume on changed data warns once (sampler.py); this says which files were added, removed,
rewritten, moved to another bucket, or newly skipped or taken in. Both sides are index caches
(index_cache.py, as ``LoadedIndex.change_view`` gives them): the one the checkpoint's run
started from, kept by index_history.py, and the current one. Pure: plain dicts in, lines of
text out.
"""

from __future__ import annotations

from typing import Any, Mapping

from simpletuner.common.names import printable

NAMED_PER_KIND = 10  # files named per kind of change; the rest are counted


def _files(cache: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """sample id -> (byte size, change key) of every listed file."""
    files = cache["files"]
    return dict(zip(files["ids"], zip(files["bytes"], files["change_key"])))


def _bucket_of(cache: Mapping[str, Any]) -> dict[str, str]:
    """sample id -> bucket of every indexed file (buckets are rows of ``files``)."""
    ids = cache["files"]["ids"]
    return {ids[row]: key for key, rows in cache["index"]["buckets"].items() for row in rows}


def _named(kind: str, items: list[str]) -> str:
    more = len(items) - NAMED_PER_KIND
    names = ", ".join(items[:NAMED_PER_KIND]) + (f" and {more} more" if more > 0 else "")
    return f"{len(items)} {kind} ({names})"


def describe_file_changes(dataset_id: str, before: Mapping[str, Any],
                          after: Mapping[str, Any]) -> list[str]:
    """One line naming the files that differ between two index caches; none if no file does
    (only settings changed, say)."""
    files_then, files_now = _files(before), _files(after)
    bucket_then, bucket_now = _bucket_of(before), _bucket_of(after)
    both = files_then.keys() & files_now.keys()
    moved = {s: f"{bucket_then[s]} -> {bucket_now[s]}"
             for s in bucket_then.keys() & bucket_now.keys() if bucket_then[s] != bucket_now[s]}
    kinds = (
        ("added", files_now.keys() - files_then.keys()),
        ("removed", files_then.keys() - files_now.keys()),
        ("rewritten", {s for s in both if files_then[s] != files_now[s]}),
        ("moved to another bucket", moved.keys()),
        ("now skipped", {s for s in both if s in bucket_then and s not in bucket_now}),
        ("no longer skipped", {s for s in both if s in bucket_now and s not in bucket_then}),
    )
    parts = [_named(kind, [printable(s) + (f" {moved[s]}" if kind.startswith("moved") else "")
                           for s in sorted(ids)])
             for kind, ids in kinds if ids]
    return [f"dataset '{dataset_id}' files: " + "; ".join(parts)] if parts else []
