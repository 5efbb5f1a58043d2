"""The audit's plan (what should happen) and its check of the rank traces (what did happen).

Counting is per occurrence: a sample with ``repeats: r`` is expected ``r+1`` times per pass (one
permutation of the bucket). Epoch ``e`` should assign its pass less what it trims and what it
carries into epoch ``e+1``, plus what epoch ``e-1`` carried into it (``bucket_tail: carry``).
With ``x`` expected and ``y`` assigned occurrences of a (dataset, bucket, sample): ``unique`` adds
``min(x, y)``, ``missing`` adds ``x - y`` when short and ``duplicated`` adds ``y - x`` when over
(a sample in the wrong bucket is both). Stand-ins (evaluation) are never counted.

Neither the trim nor the carry is taken on trust from the split that produced the plan: each
bucket's counts are re-derived here from the index and the settings (trim: its occurrences
modulo ``E`` every epoch; carry: stepped epoch by epoch from nothing carried into epoch 0, each
epoch leaving (carried in + occurrences) modulo ``E``; evaluation: nothing), and what is carried
must be trained in the bucket's first micro-batches of the next epoch. So a split that trims or
carries too much cannot hide behind its own report, and with carry every occurrence of every
pass is assigned exactly once over the audited epochs, except the last epoch's carried ones,
which are reported as untrained.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from simpletuner.helpers.metadata.split import DatasetSpec
from simpletuner.helpers.metadata.epoch_counts import bucket_counts
from simpletuner.helpers.multiaspect.dataset_schedule import DatasetSchedule
from simpletuner.helpers.multiaspect.verify_mesh import group_traces
from simpletuner.helpers.multiaspect.verify_pairs import pair_problems
from simpletuner.helpers.multiaspect.verify_schedule import (Presence, expected_presence,
                                                             schedule_problems)

Leftovers = dict[int, dict[str, dict[str, list[str]]]]  # epoch -> dataset -> bucket -> ids


def build_plan(*, seed: int, world_size: int, accumulation: int, datasets: list[DatasetSpec],
               trimmed: Leftovers, carried: Leftovers, context_parallel: int = 1,
               schedules: dict[str, DatasetSchedule] | None = None,
               references: dict[str, dict[str, list[str]]] | None = None) -> dict:
    """plan.json's content. ``trimmed``/``carried``: each epoch's trimmed occurrences and those
    it carries into the next epoch (nothing for an epoch before a dataset joins);
    ``world_size``: the data-parallel groups, of ``context_parallel`` ranks each;
    ``references``: dataset id -> sample id -> its reference ids (edit pairs)."""
    planned = {}
    for spec in sorted(datasets, key=lambda s: s.dataset_id):
        schedule = (schedules or {}).get(spec.dataset_id, DatasetSchedule())
        eff = spec.effective_batch(world_size, accumulation)
        counts = {key: bucket_counts(len(ids), spec.repeats, eff, tail=spec.bucket_tail,
                                     allow_oversubscription=spec.allow_oversubscription)
                  for key, ids in sorted(spec.buckets.items())}
        planned[spec.dataset_id] = {
            "repeats": spec.repeats,
            "batch_size": spec.batch_size,
            "evaluation": spec.evaluation,
            "allow_oversubscription": spec.allow_oversubscription,
            "bucket_tail": spec.bucket_tail,
            "effective_batch": eff.total,
            "buckets": {key: sorted(ids) for key, ids in sorted(spec.buckets.items())},
            # Undersized buckets that allow_dataset_oversubscription cycled up to E occurrences.
            "extended": {key: c.occurrences for key, c in counts.items() if c.extended},
            "probability": schedule.probability,
            "start_epoch": schedule.start_epoch,
            "start_step": schedule.start_step,
            "end_epoch": schedule.end_epoch,
            "end_step": schedule.end_step,
        }
        if (references or {}).get(spec.dataset_id):
            planned[spec.dataset_id]["references"] = dict(sorted(
                references[spec.dataset_id].items()))

    def per_epoch(found: Leftovers) -> dict:
        return {str(epoch): {d: dict(sorted(found[epoch].get(d, {}).items())) for d in planned}
                for epoch in sorted(found)}

    return {"seed": seed, "world_size": world_size, "context_parallel": context_parallel,
            "accumulation": accumulation,
            "datasets": planned, "epochs": per_epoch(trimmed), "carried": per_epoch(carried)}


def effective_batch(plan: dict, dataset: dict) -> int:
    """``E`` from the settings alone: B*W*G, or W for an evaluation dataset (one sample per
    rank, no accumulation)."""
    if dataset["evaluation"]:
        return plan["world_size"]
    return dataset["batch_size"] * plan["world_size"] * plan["accumulation"]


def bucket_occurrences(samples: int, dataset: dict, e: int) -> tuple[int, bool]:
    """Occurrences per pass, and whether oversubscription (on, no manual repeats, a training
    dataset) cycled an undersized bucket up to ``E``."""
    natural = samples * (dataset["repeats"] + 1)
    if (dataset["allow_oversubscription"] and not dataset["evaluation"]
            and dataset["repeats"] == 0 and 0 < natural < e):
        return e, True
    return natural, False


def tail_rule(dataset: dict, extended: bool) -> str | None:
    """'trim' or 'carry' where a bucket has a leftover; None for evaluation (every occurrence
    is evaluated) and for an extended bucket (exactly E occurrences)."""
    return None if dataset["evaluation"] or extended else dataset["bucket_tail"]


def expected_leftovers(dataset: dict, total: int, e: int, extended: bool,
                       epochs: int) -> list[tuple[int, int]]:
    """(trimmed, carried into the next epoch) for epochs 0.. from the settings alone."""
    rule = tail_rule(dataset, extended)
    if rule is None:
        return [(0, 0)] * epochs
    if rule == "trim":
        return [(total % e, 0)] * epochs
    found, carried = [], 0
    for _ in range(epochs):  # each epoch trains what came in first, then its own pass
        carried = (carried + total) % e
        found.append((0, carried))
    return found


def dataset_steps(plan: dict, dataset_id: str, nth: int) -> int:
    """Optimizer steps of a dataset in the ``nth`` epoch since it joined (0 = its first),
    from the settings alone."""
    d = plan["datasets"][dataset_id]
    e = effective_batch(plan, d)
    steps = 0
    for ids in d["buckets"].values():
        total, extended = bucket_occurrences(len(ids), d, e)
        leftovers = expected_leftovers(d, total, e, extended, nth + 1)
        carried_in = leftovers[nth - 1][1] if nth else 0
        steps += (carried_in + total - sum(leftovers[nth])) // e
    return steps


def untrimmed_occurrences(plan: dict) -> Counter:
    """(dataset, bucket, sample) -> occurrences per pass."""
    expected: Counter = Counter()
    for dataset_id, d in plan["datasets"].items():
        e = effective_batch(plan, d)
        for key, ids in d["buckets"].items():
            total, extended = bucket_occurrences(len(ids), d, e)
            if extended:  # cyclic extension of the sorted ids to E occurrences (see split.py)
                for i, sample in enumerate(sorted(ids)):
                    expected[(dataset_id, key, sample)] += total // len(ids) + (
                        1 if i < total % len(ids) else 0)
            else:
                for sample in ids:
                    expected[(dataset_id, key, sample)] += d["repeats"] + 1
    return expected


def _listed(plan: dict, kind: str, epoch: int) -> Counter:
    """(dataset, bucket, sample) -> occurrences the plan lists as trimmed or carried in
    ``epoch`` (none before epoch 0)."""
    found = plan[kind].get(str(epoch), {})
    return Counter((dataset_id, key, s) for dataset_id, buckets in found.items()
                   for key, ids in buckets.items() for s in ids)


def expected_occurrences(plan: dict, epoch: int, untrimmed: Counter,
                         present: dict[str, Presence] | None = None) -> Counter:
    """(dataset, bucket, sample) -> occurrences the epoch should assign; only datasets the
    epoch holds (``present``; None: all)."""
    carried_in = _listed(plan, "carried", epoch - 1)
    if present is not None:  # what an ended dataset carried out is never trained
        untrimmed = Counter({k: n for k, n in untrimmed.items() if k[0] in present})
        carried_in = Counter({k: n for k, n in carried_in.items() if k[0] in present})
    expected = untrimmed + carried_in
    expected.subtract(_listed(plan, "epochs", epoch))
    expected.subtract(_listed(plan, "carried", epoch))
    return expected


def leftover_problems(plan: dict, epoch: int, untrimmed: Counter,
                      present: dict[str, Presence] | None = None) -> list[str]:
    """Each bucket's trim and carry must be the counts re-derived from the settings (counted
    from the epoch its dataset joined; none before), and only ids of that bucket."""
    problems = []
    for dataset_id, d in plan["datasets"].items():
        e = effective_batch(plan, d)
        if d["effective_batch"] != e:
            problems.append(f"dataset '{dataset_id}': plan says E = {d['effective_batch']}, "
                            f"the settings give {e}")
        for kind in ("epochs", "carried"):
            listed = plan[kind][str(epoch)].get(dataset_id, {})
            for key in sorted(set(listed) - set(d["buckets"])):
                problems.append(f"epoch {epoch}: dataset '{dataset_id}': lists unknown bucket "
                                f"{key}")
        joined = Presence(0, 0) if present is None else present.get(dataset_id)
        for key, ids in d["buckets"].items():
            problems += _bucket_leftover_problems(plan, epoch, untrimmed, dataset_id, key, e,
                                                  joined)
    return problems


def _bucket_leftover_problems(plan: dict, epoch: int, untrimmed: Counter, dataset_id: str,
                              key: str, e: int, joined: Presence | None) -> list[str]:
    d = plan["datasets"][dataset_id]
    total, extended = bucket_occurrences(len(d["buckets"][key]), d, e)
    problems = []
    if extended != (key in d["extended"]):
        problems.append(f"dataset '{dataset_id}' bucket {key}: plan and settings disagree on "
                        "whether oversubscription extends it")
    where = f"epoch {epoch}: dataset '{dataset_id}' bucket {key}"
    nth = epoch - joined.first_epoch if joined else 0  # epochs since the dataset joined
    leftovers = expected_leftovers(d, total, e, extended, nth + 1)
    carried_in = leftovers[nth - 1][1] if nth else 0
    trimmed = plan["epochs"][str(epoch)].get(dataset_id, {}).get(key, [])
    carried = plan["carried"][str(epoch)].get(dataset_id, {}).get(key, [])
    want_trimmed, want_carried = leftovers[nth] if joined else (0, 0)
    rule = tail_rule(d, extended) if joined else None
    if len(trimmed) != want_trimmed:
        problems.append(f"{where}: {len(trimmed)} occurrences trimmed, expected {total} mod "
                        f"E={e} = {want_trimmed}" if rule == "trim" else
                        f"{where}: {len(trimmed)} occurrences trimmed, expected none")
    if len(carried) != want_carried:
        problems.append(f"{where}: {len(carried)} occurrences carried into epoch {epoch + 1}, "
                        f"expected ({carried_in} carried in + {total}) mod E={e} = "
                        f"{want_carried}" if rule == "carry" else
                        f"{where}: {len(carried)} occurrences carried, expected none")
    over = Counter((dataset_id, key, s) for s in trimmed + carried) - untrimmed
    if over:
        problems.append(f"{where}: trims or carries occurrences the bucket does not have: "
                        f"{sorted(over)[:5]}")
    return problems


def carried_first_problems(plan: dict, epoch: int, per_rank: dict[int, list[dict]]) -> list[str]:
    """What epoch ``epoch-1`` carried must open the bucket in ``epoch``: be among the samples
    of its first micro-batches over the ranks (ceil(carried / (B*W)) of them per rank)."""
    problems = []
    for dataset_id, buckets in plan["carried"].get(str(epoch - 1), {}).items():
        width = plan["datasets"][dataset_id]["batch_size"] * plan["world_size"]
        for key, carried in buckets.items():
            first = math.ceil(len(carried) / width)
            opened: Counter = Counter()
            trained: Counter = Counter()  # an end (end_step) may leave carried ones untrained
            for records in per_rank.values():
                of_bucket = [r for r in records if (r["dataset"], r["bucket"]) == (dataset_id, key)]
                opened.update(s for r in of_bucket[:first] for s in r["samples"])
                trained.update(s for r in of_bucket for s in r["samples"])
            late = (Counter(carried) & trained) - opened
            if late:
                problems.append(f"epoch {epoch}: dataset '{dataset_id}' bucket {key}: "
                                f"occurrences carried from epoch {epoch - 1} are not trained "
                                f"first: {sorted(late)[:5]}")
    return problems


@dataclass(frozen=True)
class EpochSummary:
    epoch: int
    assigned: int
    unique: int
    missing: int
    duplicated: int
    trimmed: int
    carried: int   # into the next epoch (bucket_tail carry)
    ended: int = 0  # left untrained by a dataset that ended: cut by end_step, or carried in

    def line(self) -> str:
        ended = f", {self.ended} left untrained by an end" if self.ended else ""
        return (f"epoch {self.epoch}: {self.assigned} assigned, {self.unique} unique, "
                f"{self.missing} missing, {self.duplicated} duplicated, {self.trimmed} trimmed, "
                f"{self.carried} carried into epoch {self.epoch + 1}{ended}")


@dataclass
class AuditReport:
    epochs: list[EpochSummary]
    problems: list[str] = field(default_factory=list)   # lockstep, step-count, tail violations

    @property
    def ok(self) -> bool:
        return not self.problems and all(e.missing == 0 and e.duplicated == 0 for e in self.epochs)

    @property
    def untrained(self) -> int:
        """Carried past the last audited epoch: short of one effective batch when it ends."""
        return self.epochs[-1].carried if self.epochs else 0

    def lines(self) -> list[str]:
        verdict = "FAILED"
        if self.ok:
            verdict = "OK: every kept occurrence assigned exactly once"
            ended = sum(e.ended for e in self.epochs)
            if ended:
                verdict += f"; {ended} left untrained where a dataset ended (end_epoch, end_step)"
            if any(e.carried for e in self.epochs):
                verdict += (f"; every carried one in the next epoch, so only the last epoch's "
                            f"{self.untrained} (short of one effective batch) are untrained")
        return [e.line() for e in self.epochs] + [f"problem: {p}" for p in self.problems] + [verdict]


def _lockstep_problems(epoch: int, per_rank: dict[int, list[dict]]) -> list[str]:
    problems = []
    counts = {rank: len(records) for rank, records in per_rank.items()}
    if len(set(counts.values())) > 1:
        problems.append(f"epoch {epoch}: ranks have different micro-batch counts {counts}")
    for rank, records in per_rank.items():
        steps = [r["step"] for r in records]
        if steps != list(range(len(steps))):
            problems.append(f"epoch {epoch}: rank {rank} steps are not 0..{len(steps) - 1}")
    for step in range(min(counts.values(), default=0)):
        where = {rank: (records[step]["dataset"], records[step]["bucket"])
                 for rank, records in per_rank.items()}
        if len(set(where.values())) > 1:
            problems.append(f"epoch {epoch} step {step}: ranks draw from different buckets {where}")
            break
    return problems


def verify(plan: dict, traces: dict[int, list[dict]]) -> AuditReport:
    """Compare every rank's trace with the plan, epoch by epoch; with context parallel, each
    data-parallel group's ranks with each other first (verify_mesh.py)."""
    problems, traces = group_traces(plan, traces)
    world = plan["world_size"]
    if sorted(traces) != list(range(world)):
        problems.append(f"expected traces of ranks 0..{world - 1}, got {sorted(traces)}")
    planned = sorted(int(e) for e in plan["epochs"])
    extra = sorted({r["epoch"] for records in traces.values() for r in records} - set(planned))
    if extra:
        problems.append(f"traces contain epochs {extra} that the plan does not cover")
    summaries = []
    untrimmed = untrimmed_occurrences(plan)
    presence = expected_presence(
        plan, max(planned, default=-1) + 1,
        lambda dataset_id, nth: dataset_steps(plan, dataset_id, nth),
        lambda epoch: max((sum(r["epoch"] == epoch for r in records) for records in
                           traces.values()), default=0) // plan["accumulation"])
    for epoch in planned:
        per_rank = {rank: [r for r in records if r["epoch"] == epoch]
                    for rank, records in sorted(traces.items())}
        present = presence[epoch]
        problems.extend(_lockstep_problems(epoch, per_rank))
        problems.extend(leftover_problems(plan, epoch, untrimmed, present))
        problems.extend(carried_first_problems(plan, epoch, per_rank))
        problems.extend(schedule_problems(plan, epoch, per_rank, present))
        problems.extend(pair_problems(plan, epoch, per_rank))
        got = Counter((r["dataset"], r["bucket"], s) for records in per_rank.values()
                      for r in records if not r.get("stand_in") for s in r["samples"])
        expected = expected_occurrences(plan, epoch, untrimmed, present)
        keys = set(got) | set(expected)
        cut = {k for k in keys if present.get(k[0], Presence(0, 0)).leave is not None}
        summaries.append(EpochSummary(
            epoch=epoch,
            assigned=sum(got.values()),
            unique=sum(min(got[k], expected[k]) for k in keys),
            missing=sum(max(0, expected[k] - got[k]) for k in keys - cut),
            ended=sum(max(0, expected[k] - got[k]) for k in cut) + sum(
                n for k, n in _listed(plan, "carried", epoch - 1).items() if k[0] not in present),
            duplicated=sum(max(0, got[k] - expected[k]) for k in keys),
            trimmed=sum(_listed(plan, "epochs", epoch).values()),
            carried=sum(_listed(plan, "carried", epoch).values()),
        ))
    return AuditReport(summaries, problems)
