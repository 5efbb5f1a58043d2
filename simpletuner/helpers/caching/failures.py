"""Samples that failed while caching must leave the index on every rank, identically, before
the split. Each rank only knows its own share's failures, so they are gathered once, here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from accelerate.utils import gather_object

from simpletuner.common.peer_watch import in_collective


def merge_failures(per_rank: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Pure: one mapping (sample id -> reason) from every rank's, sorted by sample id. When two
    ranks report the same sample, the first reason wins, so the result is identical everywhere."""
    merged: dict[str, str] = {}
    for failures in per_rank:
        for sample_id, reason in failures.items():
            merged.setdefault(sample_id, reason)
    return dict(sorted(merged.items()))


def gather_failures(local: Mapping[str, str]) -> dict[str, str]:
    """The collective: every rank must call this, after building the Accelerator (with an empty
    mapping when it has nothing), and gets the same merged result. Also a synchronisation
    point: when it returns, every rank has finished its share of the cache."""
    with in_collective("the caching failures' gather"):
        return merge_failures(gather_object([dict(local)]))


def describe_failures(dataset_id: str, failures: Mapping[str, str], limit: int = 20) -> str:
    """A short report for the log: how many samples were removed and why."""
    lines = [f"dataset {dataset_id!r}: {len(failures)} image(s) could not be cached and were "
             "removed from training:"]
    for sample_id, reason in list(failures.items())[:limit]:
        lines.append(f"  {sample_id}: {reason}")
    if len(failures) > limit:
        lines.append(f"  ... and {len(failures) - limit} more")
    return "\n".join(lines)
