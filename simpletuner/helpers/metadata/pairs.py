"""Edit pairs (pure): each target sample with its reference in every conditioning dataset,
matched by relative path without the extension ('a/cat.png' <- 'a/cat.jpg').

A pair is one sample: the target index keeps its ids and buckets and gains ``references``
(sample id -> one reference id per conditioning dataset, in conditioning_data order). A target
without a reference in some conditioning dataset, a reference without its target, and files
whose stem another file of the same dataset shares (which one is meant?) are skipped with the
reason, on their own side, and never trained. Everything here works on sorted ids, so the
listing order of either folder changes nothing.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from simpletuner.helpers.metadata.index import DatasetIndex


PAIR = "edit pair"  # how every reason given here starts


def pair_key(sample_id: str) -> str:
    """The relative path without its extension: what a target and its reference share."""
    return posixpath.splitext(sample_id)[0]


@dataclass(frozen=True)
class PairedIndexes:
    target: DatasetIndex            # with ``references``; orphans moved to its skipped list
    references: list[DatasetIndex]  # each conditioning index, its orphans skipped


def _by_key(ids: Iterable[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """key -> the one id with it, and key -> the ids that share it."""
    found: dict[str, list[str]] = {}
    for sample_id in sorted(ids):
        found.setdefault(pair_key(sample_id), []).append(sample_id)
    unique = {key: ids[0] for key, ids in found.items() if len(ids) == 1}
    return unique, {key: ids for key, ids in found.items() if len(ids) > 1}


def _shared_stem(ids: list[str]) -> str:
    return (f"{PAIR}: {len(ids)} files share the name {pair_key(ids[0])!r} "
            f"({', '.join(ids)}); rename all but one")


def pair_references(target: DatasetIndex, references: Sequence[DatasetIndex]) -> PairedIndexes:
    """``target`` paired with one reference per index of ``references``."""
    targets, target_clashes = _by_key(s for ids in target.buckets.values() for s in ids)
    sides = [_by_key(s for ids in ref.buckets.values() for s in ids) for ref in references]
    removed = {s: _shared_stem(ids) for ids in target_clashes.values() for s in ids}
    for key, sample_id in targets.items():
        lacking = [ref.dataset_id for ref, (found, _) in zip(references, sides)
                   if key not in found]
        if lacking:
            removed[sample_id] = (f"{PAIR}: no usable reference named {key!r} (any "
                                  f"extension) in conditioning dataset(s) {', '.join(lacking)}"
                                  " (missing, or skipped there)")
    paired = {s: tuple(found[key] for found, _ in sides)
              for key, s in targets.items() if s not in removed}
    kept = replace(target.without(removed), references=paired)
    wanted = {key for key, s in targets.items() if s in paired}
    return PairedIndexes(kept, [
        _orphan_references(ref, found, clashes, wanted, target.dataset_id)
        for ref, (found, clashes) in zip(references, sides)])


def _orphan_references(ref: DatasetIndex, found: dict[str, str], clashes: dict[str, list[str]],
                       wanted: set[str], target_id: str) -> DatasetIndex:
    removed = {s: _shared_stem(ids) for ids in clashes.values() for s in ids}
    for key, sample_id in found.items():
        if key not in wanted:
            removed[sample_id] = (f"{PAIR}: no usable target named {key!r} in dataset "
                                  f"'{target_id}' (missing, skipped or ambiguous there)")
    return ref.without(removed)


def pair_datasets(datasets: Sequence, indexes: Mapping[str, DatasetIndex]
                  ) -> tuple[dict[str, DatasetIndex], dict[str, DatasetIndex]]:
    """The indexes of ``datasets`` (configuration.DatasetConfig), each with conditioning_data
    paired with its conditioning datasets' indexes (also in ``indexes``), and the conditioning
    indexes with their orphans skipped."""
    trained, references = {}, {}
    for ds in datasets:
        conditioning = ds.conditioning_ids()
        if not conditioning:
            trained[ds.id] = indexes[ds.id]
            continue
        paired = pair_references(indexes[ds.id], [indexes[c] for c in conditioning])
        trained[ds.id] = paired.target
        references.update(zip(conditioning, paired.references))
    return trained, references


def pair_summary(target: DatasetIndex, references: Sequence[DatasetIndex]) -> str:
    """One line for the log: pairs kept and orphans on each side, counted."""
    def orphans(index: DatasetIndex) -> int:
        return sum(n for reason, n in index.skipped.counts().items()
                   if reason.startswith(PAIR))

    sides = "; ".join(f"{orphans(ref)} in '{ref.dataset_id}' without a target"
                      for ref in references)
    return (f"edit pairs of dataset '{target.dataset_id}': {len(target.references)} paired; "
            f"{orphans(target)} targets without a reference; {sides} (skipped, never trained)")
