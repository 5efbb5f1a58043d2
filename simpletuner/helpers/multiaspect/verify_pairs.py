"""The audit's check of edit pairs: every traced sample of a paired dataset was trained with
exactly the references the plan pairs it with (plan.json ``datasets.<id>.references``)."""

from __future__ import annotations

NAMED = 5  # mismatches named per epoch; the rest are counted


def pair_problems(plan: dict, epoch: int, per_rank: dict[int, list[dict]]) -> list[str]:
    wrong = []
    for rank, records in per_rank.items():
        for record in records:
            expected = plan["datasets"].get(record["dataset"], {}).get("references")
            if not expected:
                continue
            got = record.get("references") or [[] for _ in record["samples"]]
            for sample_id, refs in zip(record["samples"], got):
                if list(refs) != expected.get(sample_id):
                    wrong.append(f"rank {rank} step {record['step']}: {record['dataset']}/"
                                 f"{sample_id} with references {list(refs)}, expected "
                                 f"{expected.get(sample_id)}")
            if len(got) != len(record["samples"]):
                wrong.append(f"rank {rank} step {record['step']}: {len(got)} reference lists "
                             f"for {len(record['samples'])} samples")
    if not wrong:
        return []
    more = f"; ... and {len(wrong) - NAMED} more" if len(wrong) > NAMED else ""
    return [f"epoch {epoch}: {len(wrong)} samples not trained with their own references: "
            + "; ".join(wrong[:NAMED]) + more]
