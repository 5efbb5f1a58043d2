"""Edit pairs on real processes: `python -m simpletuner.audit` under torchrun (3 gloo ranks,
batch 2) on targets and references in two buckets, with an orphan on each side, the
references written in the reverse order of the targets and with another extension. Every
kept target is assigned exactly once per epoch, on one rank, with its own reference; the
orphans are never traced and are counted in the log; plan.json names every pair. The same for
loss masks (conditioning_type 'mask', any model: here SD 1.x) on 2 ranks: each target with its
own mask; and for FLUX.2 klein with two references per target on 2 ranks: each with its own
two, in conditioning_data's order."""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from PIL import Image

from edit_fixtures import circle, edit_datasets
from launching import run_bounded
from training_fixtures import environment, read_jsonl, write_config

EPOCHS = 2


def make_pairs(root: Path) -> tuple[Path, Path, list[str]]:
    """12 pairs at 64x64 and 9 at 96x64, references written last-first; one orphan each side."""
    targets, references = root / "targets", root / "references"
    targets.mkdir()
    (references / "sub").mkdir(parents=True)
    names = [f"sub/{w}x{h}-{i:02d}" for w, h, n in ((64, 64, 12), (96, 64, 9))
             for i in range(n)]
    (targets / "sub").mkdir()
    for name in names:
        w, h = map(int, name.split("/")[1].split("-")[0].split("x"))
        circle("red", "blue", (w, h)).save(targets / f"{name}.png")
        (targets / f"{name}.txt").write_text("make the circle red")
    for name in reversed(names):
        w, h = map(int, name.split("/")[1].split("-")[0].split("x"))
        circle("green", "blue", (w, h)).save(references / f"{name}.webp")
    circle("red", "blue", (64, 64)).save(targets / "sub" / "no-reference.png")
    (targets / "sub" / "no-reference.txt").write_text("orphan")
    circle("red", "blue", (64, 64)).save(references / "no-target.webp")
    return targets, references, [f"{name}.png" for name in names]


class PairAudit:
    """Mixed into a TestCase: the audit of ``world`` ranks on ``make_pairs``' folders, the
    references named by ``datasets(targets, references)``, with config.json ``options``;
    each target's references are named as itself with the ``extensions``, in their order."""

    world: int
    options: dict
    extensions = (".webp",)

    @classmethod
    def expected(cls, sample_id: str) -> list[str]:
        return [sample_id.replace(".png", extension) for extension in cls.extensions]

    @staticmethod
    def datasets(targets: Path, references: Path) -> list[dict]:
        return edit_datasets(targets, references)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-edit-audit-")
        root = Path(cls.tmp)
        targets, references, cls.kept = make_pairs(root)
        config = write_config(root, targets, datasets=cls.datasets(targets, references),
                              bucket_tail="trim", **cls.options)
        cls.out = root / "audit"
        env = dict(environment(cls.tmp), ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
        cls.result = run_bounded(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             str(cls.world), "-m", "simpletuner.audit", "--config", str(config), "--output",
             str(cls.out), "--epochs", str(EPOCHS)], tmpdir=cls.tmp, env=env, timeout=240)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_kept_target_once_per_epoch_on_one_rank_with_its_own_reference(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        records = {rank: read_jsonl(self.out / f"rank-{rank}.jsonl")
                   for rank in range(self.world)}
        self.assertEqual(len({len(r) for r in records.values()}), 1)  # lockstep lengths
        effective = 2 * self.world
        for epoch in range(EPOCHS):
            seen = Counter()
            for rank_records in records.values():
                for record in (r for r in rank_records if r["epoch"] == epoch):
                    for sample_id, refs in zip(record["samples"], record["references"],
                                               strict=True):
                        self.assertEqual(refs, self.expected(sample_id))
                        seen[sample_id] += 1
            self.assertEqual(set(seen.values()), {1})
            self.assertLessEqual(set(seen), set(self.kept))
            # buckets of 12 and 9 with E = 6 (4): only 9's tail of 3 (1) is trimmed each epoch
            self.assertEqual(len(self.kept) - len(seen), 9 % effective)
        self.assertIn("OK: every kept occurrence assigned exactly once", self.result.stdout)

    def test_the_orphans_are_counted_and_plan_json_names_every_pair(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        self.assertIn("edit pairs of dataset 'edits': 21 paired; 1 targets without a "
                      f"reference; 1 in '{self.references_id}' without a target",
                      self.result.stderr)
        plan = json.loads((self.out / "plan.json").read_text())
        self.assertEqual(plan["datasets"]["edits"]["references"],
                         {s: self.expected(s) for s in sorted(self.kept)})
        traced = {s for rank in range(self.world)
                  for r in read_jsonl(self.out / f"rank-{rank}.jsonl") for s in r["samples"]}
        self.assertNotIn("sub/no-reference.png", traced)


class EditPairAuditTest(PairAudit, unittest.TestCase):
    world, references_id = 3, "edit-references"
    options = dict(model_family="flux", model_flavour="kontext",
                   pretrained_model_name_or_path="builtin:tiny-flux-kontext")


class TwoReferenceAuditTest(PairAudit, unittest.TestCase):
    """FLUX.2 klein with two references per target, the second folder's as JPEG written in
    a shuffled order."""

    world, references_id, extensions = 2, "edit-references", (".webp", ".jpg")
    options = dict(model_family="flux2", model_flavour="klein-4b",
                   pretrained_model_name_or_path="builtin:tiny-flux2")

    @staticmethod
    def datasets(targets: Path, references: Path) -> list[dict]:
        second = references.parent / "second-references"
        files = sorted(p for p in references.rglob("*.webp"))
        random.Random(5).shuffle(files)
        for path in files:
            copy = (second / path.relative_to(references)).with_suffix(".jpg")
            copy.parent.mkdir(parents=True, exist_ok=True)
            with Image.open(path) as image:
                image.convert("RGB").save(copy)
        edits, first = edit_datasets(targets, references)
        return [{**edits, "conditioning_data": ["edit-references", "second"]}, first,
                {**first, "id": "second", "instance_data_dir": str(second)}]


class MaskAuditTest(PairAudit, unittest.TestCase):
    world, references_id, options = 2, "masks", {}

    @staticmethod
    def datasets(targets: Path, references: Path) -> list[dict]:
        return [{"id": "edits", "instance_data_dir": str(targets),
                 "caption_strategy": "textfile", "conditioning_data": "masks"},
                {"id": "masks", "dataset_type": "conditioning", "conditioning_type": "mask",
                 "instance_data_dir": str(references)}]


if __name__ == "__main__":
    unittest.main()
