"""The edit demo: every target pairs with its reference by name, the target shows the shape in
the colour its instruction names and the reference the same shape in its old colour on the
same background, the bytes are the same on every generation, and plan pairs all of them."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
from PIL import Image

from simpletuner.demo_data import COLOURS
from simpletuner.demo_edits import EDITS, REFERENCES, ensure_edit_demo
from simpletuner.planning import run_plan
from training_fixtures import write_config


def share(path: Path, colour: str) -> float:
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
    return float((np.abs(pixels - np.array(COLOURS[colour])).sum(axis=2) < 30).mean())


class EditDemoTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="st-edit-demo-"))
        cls.folder = ensure_edit_demo(cls.tmp / "demo")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_each_target_shows_its_instruction_and_its_reference_the_shape_before(self):
        targets = sorted((self.folder / EDITS).glob("*.png"))
        self.assertEqual(len(targets), 108)
        for target in targets:
            reference = self.folder / REFERENCES / target.name
            # "make the <shape> <colour>"; the stem: NNN-<old colour>-<shape>-on-<background>
            _, _, shape, new = target.with_suffix(".txt").read_text().split()
            _, old, stem_shape, _, background = target.stem.split("-")
            with self.subTest(target.name):
                self.assertEqual(shape, stem_shape)
                self.assertNotIn(new, (old, background))
                self.assertGreater(share(target, new), 0.05)
                self.assertGreater(share(reference, old), 0.05)
                self.assertLess(share(target, old), 0.01)
                self.assertGreater(min(share(target, background),
                                       share(reference, background)), 0.35)

    def test_a_second_generation_is_byte_identical(self):
        second = ensure_edit_demo(self.tmp / "second")

        def hashes(folder: Path) -> dict[str, str]:
            return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(folder.rglob("*")) if p.is_file()}

        self.assertEqual(hashes(self.folder), hashes(second))

    def test_plan_pairs_every_target_with_its_reference(self):
        datasets = [{"id": "edits", "instance_data_dir": str(self.folder / EDITS),
                     "conditioning_data": "references"},
                    {"id": "references", "conditioning_type": "reference_strict",
                     "instance_data_dir": str(self.folder / REFERENCES)}]
        config = write_config(self.tmp, self.folder, "plan", datasets=datasets,
                              model_family="flux", model_flavour="kontext")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            status = run_plan(str(config), as_json=True)
        self.assertEqual(status, 0)
        plan = json.loads(out.getvalue())["datasets"]["edits"]
        self.assertEqual(sum(len(ids) for ids in plan["buckets"].values()), 108)
        self.assertEqual(plan["skipped"], [])


if __name__ == "__main__":
    unittest.main()
