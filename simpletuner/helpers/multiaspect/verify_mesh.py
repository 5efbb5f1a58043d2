"""The audit's check of a context-parallel mesh (helpers/metadata/mesh.py): the ``C`` ranks of
each data-parallel group must have traced the identical micro-batches (epoch, step, dataset,
bucket, samples in order, references, stand-ins) and named their own group. What remains is one
trace per group, which the exactly-once check takes as it takes one rank's without context
parallel: ``plan["world_size"]`` is the number of groups."""

from __future__ import annotations

from simpletuner.helpers.metadata.mesh import Mesh

GROUP = "group"  # the trace's field for the rank's data-parallel group


def _without_group(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k != GROUP} for record in records]


def _first_difference(mine: list[dict], theirs: list[dict]) -> str | None:
    for record, other in zip(mine, theirs):
        if record != other:
            return (f"at epoch {other['epoch']} step {other['step']}: {other['samples']} "
                    f"({other['bucket']}) against {record['samples']} ({record['bucket']})")
    if len(mine) != len(theirs):
        return f"{len(theirs)} micro-batches against {len(mine)}"
    return None


def group_traces(plan: dict, traces: dict[int, list[dict]]
                 ) -> tuple[list[str], dict[int, list[dict]]]:
    """(problems, data-parallel group -> its trace). Without context parallel the traces are
    the groups' as they are."""
    c = int(plan.get("context_parallel", 1))
    if c == 1:
        return [], traces
    groups = int(plan["world_size"])
    problems = []
    if sorted(traces) != list(range(groups * c)):
        problems.append(f"expected traces of ranks 0..{groups * c - 1} ({groups} data-parallel "
                        f"groups x context_parallel_size {c}), got {sorted(traces)}")
    found = {}
    mesh = Mesh(groups * c, c)
    for group in range(groups):
        ranks = [r for r in mesh.ranks_of(group) if r in traces]
        for rank in ranks:
            named = {record.get(GROUP) for record in traces[rank]} - {group}
            if named:
                problems.append(f"rank {rank}: its trace names data-parallel group "
                                f"{sorted(named, key=str)}, expected {group} (rank // {c})")
        if not ranks:
            continue
        first = _without_group(traces[ranks[0]])
        for rank in ranks[1:]:
            differs = _first_difference(first, _without_group(traces[rank]))
            if differs:
                problems.append(f"context-parallel group {group}: rank {rank} did not train "
                                f"what rank {ranks[0]} trained, {differs}")
        found[group] = first
    return problems, found
