"""Flux Kontext under FSDP2: two gloo processes on edit pairs, against two DDP
processes on the same pairs and seed (test_fsdp_training.py's DdpFsdpPair): equal weights,
half the bytes per rank, weights that moved; the reference tokens go through the shards."""

from __future__ import annotations

import unittest

from edit_fixtures import edit_datasets, make_edit_pairs
from test_family_flux_kontext import KONTEXT
from test_fsdp_training import TRANSFORMER_WEIGHTS, DdpFsdpPair
from training_fixtures import read_jsonl, write_config


class KontextFullFsdpTest(DdpFsdpPair, unittest.TestCase):
    options = dict(KONTEXT, gradient_checkpointing=True)
    weights = TRANSFORMER_WEIGHTS

    @classmethod
    def config(cls, name: str, **options):
        targets, references = cls.root / "targets", cls.root / "references"
        if not targets.is_dir():
            make_edit_pairs(cls.root, count=8)
        return write_config(cls.root, targets, name,
                            datasets=edit_datasets(targets, references), **options)

    def test_every_rank_trained_each_target_with_its_own_reference(self):
        for name in ("ddp", "fsdp"):
            for rank in (0, 1):
                records = read_jsonl(self.out(name) / "trace" / f"rank-{rank}.jsonl")
                self.assertEqual(len(records), 4)
                for record in records:
                    self.assertEqual(record["references"],
                                     [[s.replace(".png", ".jpg")] for s in record["samples"]])


if __name__ == "__main__":
    unittest.main()
