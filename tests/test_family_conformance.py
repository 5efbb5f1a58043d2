"""The conformance suite (tests/conformance.py) for the UNet families, SD3, Lumina 2, Sana and AuraFlow; the
other rows of its table run in test_family_conformance_<group>.py, one file per worker's share."""

from __future__ import annotations

import importlib
import unittest

from conformance import CASES, case_classes
from simpletuner.families import builtin_recipes, family_names

FAMILIES = ("sd1x", "sd2x", "sdxl", "sd3", "lumina2", "sana", "auraflow")
FILES = ("test_family_conformance", "test_family_conformance_flux",
         "test_family_conformance_qwen", "test_family_conformance_wan",
         "test_family_conformance_wave2", "test_family_conformance_hvid")

globals().update(case_classes(__name__, FAMILIES))


class EveryCaseRunsTest(unittest.TestCase):
    def test_every_row_of_the_table_runs_in_exactly_one_file(self):
        runs = {}
        for module_name in FILES:
            module = importlib.import_module(module_name)
            for value in vars(module).values():
                case = getattr(value, "case", None)
                if isinstance(value, type) and case is not None:
                    runs.setdefault(case, []).append(module_name)
        self.assertEqual(set(runs), set(CASES), "rows no file runs, or runs twice")
        self.assertTrue(all(len(files) == 1 for files in runs.values()), runs)

    def test_every_registered_family_and_built_in_model_has_a_row(self):
        self.assertEqual({case.family for case in CASES}, set(family_names()))
        self.assertEqual({case.model for case in CASES}, set(builtin_recipes()))


if __name__ == "__main__":
    unittest.main()
