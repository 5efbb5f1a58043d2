"""The audit's plan (what should happen) and its check of the rank traces (what did happen).

Counting is per occurrence: a sample with ``repeats: r`` is expected ``r+1`` times per epoch,
less its trimmed occurrences. With ``x`` expected and ``y`` assigned occurrences of a (dataset,
bucket, sample): ``unique`` adds ``min(x, y)``, ``missing`` adds ``x - y`` when short and
``duplicated`` adds ``y - x`` when over (a sample in the wrong bucket is both).

The trim is not taken on trust from the split that produced the plan: each bucket's trimmed
count is checked against its occurrences modulo ``E``, re-derived here from the index and the
settings (docs/DESIGN.md), so a split that trims too much cannot hide behind its own report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from simpletuner.helpers.metadata.split import DatasetSpec, bucket_counts


def build_plan(*, seed: int, world_size: int, accumulation: int, datasets: list[DatasetSpec],
               trimmed: dict[int, dict[str, dict[str, list[str]]]]) -> dict:
    """plan.json's content. ``trimmed``: epoch -> dataset id -> bucket -> trimmed occurrences."""
    planned = {}
    for spec in sorted(datasets, key=lambda s: s.dataset_id):
        eff = spec.effective_batch(world_size, accumulation)
        counts = {key: bucket_counts(len(ids), spec.repeats, eff, spec.allow_oversubscription)
                  for key, ids in sorted(spec.buckets.items())}
        planned[spec.dataset_id] = {
            "repeats": spec.repeats,
            "batch_size": spec.batch_size,
            "evaluation": spec.evaluation,
            "allow_oversubscription": spec.allow_oversubscription,
            "effective_batch": eff.total,
            "buckets": {key: sorted(ids) for key, ids in sorted(spec.buckets.items())},
            # Undersized buckets that allow_dataset_oversubscription cycled up to E occurrences.
            "extended": {key: c.occurrences for key, c in counts.items() if c.extended},
        }
    epochs = {str(epoch): {d: dict(sorted(trimmed[epoch].get(d, {}).items())) for d in planned}
              for epoch in sorted(trimmed)}
    return {"seed": seed, "world_size": world_size, "accumulation": accumulation,
            "datasets": planned, "epochs": epochs}


def effective_batch(plan: dict, dataset: dict) -> int:
    """``E`` from the settings alone: B*W*G, or W for an evaluation dataset (one sample per
    rank, no accumulation)."""
    if dataset["evaluation"]:
        return plan["world_size"]
    return dataset["batch_size"] * plan["world_size"] * plan["accumulation"]


def bucket_occurrences(samples: int, dataset: dict, e: int) -> tuple[int, bool]:
    """Occurrences per epoch before the trim, and whether oversubscription (on, no manual
    repeats) cycled an undersized bucket up to ``E``."""
    natural = samples * (dataset["repeats"] + 1)
    if dataset["allow_oversubscription"] and dataset["repeats"] == 0 and 0 < natural < e:
        return e, True
    return natural, False


def untrimmed_occurrences(plan: dict) -> Counter:
    """(dataset, bucket, sample) -> occurrences per epoch before the trim."""
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


def expected_occurrences(plan: dict, epoch: int, untrimmed: Counter) -> Counter:
    """(dataset, bucket, sample) -> occurrences the epoch should assign."""
    expected = untrimmed.copy()
    for dataset_id in plan["datasets"]:
        for key, trimmed in plan["epochs"][str(epoch)].get(dataset_id, {}).items():
            expected.subtract((dataset_id, key, sample) for sample in trimmed)
    return expected


def trim_problems(plan: dict, epoch: int, untrimmed: Counter) -> list[str]:
    """Each bucket's trim must be its occurrences modulo E and only ids of that bucket."""
    problems = []
    for dataset_id, d in plan["datasets"].items():
        e = effective_batch(plan, d)
        if d["effective_batch"] != e:
            problems.append(f"dataset '{dataset_id}': plan says E = {d['effective_batch']}, "
                            f"the settings give {e}")
        trims = plan["epochs"][str(epoch)].get(dataset_id, {})
        for key, ids in d["buckets"].items():
            total, extended = bucket_occurrences(len(ids), d, e)
            if extended != (key in d["extended"]):
                problems.append(f"dataset '{dataset_id}' bucket {key}: plan and settings "
                                "disagree on whether oversubscription extends it")
            trimmed = trims.get(key, [])
            want = 0 if extended else total % e
            if len(trimmed) != want:
                problems.append(
                    f"epoch {epoch}: dataset '{dataset_id}' bucket {key}: {len(trimmed)} "
                    f"occurrences trimmed, expected {total} mod E={e} = {want}")
            over = Counter((dataset_id, key, s) for s in trimmed) - untrimmed
            if over:
                problems.append(f"epoch {epoch}: dataset '{dataset_id}' bucket {key}: trims "
                                f"occurrences the bucket does not have: {sorted(over)[:5]}")
        for key in sorted(set(trims) - set(d["buckets"])):
            problems.append(f"epoch {epoch}: dataset '{dataset_id}': trims unknown bucket {key}")
    return problems


@dataclass(frozen=True)
class EpochSummary:
    epoch: int
    assigned: int
    unique: int
    missing: int
    duplicated: int
    trimmed: int

    def line(self) -> str:
        return (f"epoch {self.epoch}: {self.assigned} assigned, {self.unique} unique, "
                f"{self.missing} missing, {self.duplicated} duplicated, {self.trimmed} trimmed")


@dataclass
class AuditReport:
    epochs: list[EpochSummary]
    problems: list[str] = field(default_factory=list)   # lockstep and step-count violations

    @property
    def ok(self) -> bool:
        return not self.problems and all(e.missing == 0 and e.duplicated == 0 for e in self.epochs)

    def lines(self) -> list[str]:
        verdict = "OK: every kept occurrence assigned exactly once" if self.ok else "FAILED"
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
    """Compare every rank's trace with the plan, epoch by epoch."""
    problems = []
    world = plan["world_size"]
    if sorted(traces) != list(range(world)):
        problems.append(f"expected traces of ranks 0..{world - 1}, got {sorted(traces)}")
    planned = sorted(int(e) for e in plan["epochs"])
    extra = sorted({r["epoch"] for records in traces.values() for r in records} - set(planned))
    if extra:
        problems.append(f"traces contain epochs {extra} that the plan does not cover")
    summaries = []
    untrimmed = untrimmed_occurrences(plan)
    for epoch in planned:
        per_rank = {rank: [r for r in records if r["epoch"] == epoch]
                    for rank, records in sorted(traces.items())}
        problems.extend(_lockstep_problems(epoch, per_rank))
        problems.extend(trim_problems(plan, epoch, untrimmed))
        got = Counter((r["dataset"], r["bucket"], s)
                      for records in per_rank.values() for r in records for s in r["samples"])
        expected = expected_occurrences(plan, epoch, untrimmed)
        keys = set(got) | set(expected)
        summaries.append(EpochSummary(
            epoch=epoch,
            assigned=sum(got.values()),
            unique=sum(min(got[k], expected[k]) for k in keys),
            missing=sum(max(0, expected[k] - got[k]) for k in keys),
            duplicated=sum(max(0, got[k] - expected[k]) for k in keys),
            trimmed=sum(len(t) for d in plan["epochs"][str(epoch)].values() for t in d.values()),
        ))
    return AuditReport(summaries, problems)
