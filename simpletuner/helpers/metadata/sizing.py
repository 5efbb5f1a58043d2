"""`plan --num-processes N`: what the split would keep and trim on N ranks, before renting them.

Pure arithmetic over the bucket index (split.bucket_counts), no permutation is drawn.
"""

from __future__ import annotations

from typing import Sequence

from simpletuner.helpers.metadata.split import (DatasetSpec, UndersizedBucketsError,
                                                bucket_counts, check_bucket_sizes)


def split_sizing(specs: Sequence[DatasetSpec], processes: int, accumulation: int) -> dict:
    """Per dataset and bucket: kept, trimmed, micro-batches per rank, optimizer steps; per epoch."""
    datasets = {}
    micro_batches = 0
    for spec in sorted(specs, key=lambda s: s.dataset_id):
        eff = spec.effective_batch(processes, accumulation)
        buckets = {}
        for key, ids in sorted(spec.buckets.items()):
            c = bucket_counts(len(ids), spec.repeats, eff, spec.allow_oversubscription)
            buckets[key] = {"samples": c.samples, "occurrences": c.occurrences, "kept": c.kept,
                            "trimmed": c.trimmed, "extended": c.extended,
                            "micro_batches": c.micro_batches,
                            "optimizer_steps": c.optimizer_steps}
            if not spec.evaluation:
                micro_batches += c.micro_batches
        datasets[spec.dataset_id] = {"evaluation": spec.evaluation, "repeats": spec.repeats,
                                     "batch_size": eff.batch_size, "effective_batch": eff.total,
                                     "buckets": buckets}
    try:
        check_bucket_sizes(specs, processes, accumulation)
        problem = None
    except UndersizedBucketsError as exc:
        problem = str(exc)
    return {"num_processes": processes, "accumulation": accumulation,
            "micro_batches_per_epoch": micro_batches,
            "optimizer_steps_per_epoch": micro_batches // accumulation,
            "datasets": datasets, "problem": problem}


def sizing_table(sizing: dict) -> str:
    """The human-readable form of ``split_sizing``."""
    lines = [f"split over {sizing['num_processes']} processes, gradient accumulation "
             f"{sizing['accumulation']}:"]
    for dataset_id, d in sizing["datasets"].items():
        kind = " (evaluation)" if d["evaluation"] else ""
        lines.append(f"  dataset '{dataset_id}'{kind}: E = {d['effective_batch']}, "
                     f"repeats {d['repeats']}")
        lines.append(f"    {'bucket':>10} {'samples':>8} {'kept':>8} {'trimmed':>8} "
                     f"{'micro/rank':>10} {'steps':>6}")
        for key, b in d["buckets"].items():
            flag = "  extended (oversubscription)" if b["extended"] else (
                "  TOO SMALL" if b["kept"] == 0 else "")
            lines.append(f"    {key:>10} {b['samples']:>8} {b['kept']:>8} {b['trimmed']:>8} "
                         f"{b['micro_batches']:>10} {b['optimizer_steps']:>6}{flag}")
    lines.append(f"  per epoch: {sizing['micro_batches_per_epoch']} micro-batches per rank, "
                 f"{sizing['optimizer_steps_per_epoch']} optimizer steps")
    return "\n".join(lines)
