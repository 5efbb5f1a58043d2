"""Dataset kinds are plug-ins: one module each in simpletuner/dataset_kinds/, asked by
everything else instead of comparing dataset_type names."""

from __future__ import annotations

import ast
import unittest
from pathlib import Path

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.dataset_kinds import kind_named, kind_names, kind_of

PACKAGE = Path(__file__).resolve().parents[1] / "simpletuner"
# Where a dataset_type value may still be compared: the kinds themselves, and the
# text_embeds/image_embeds cache entries, which are parsed apart from sample datasets.
COMPARISONS_ALLOWED = {"dataset_kinds", "embed_entries.py"}


def dataset_type_comparisons(path: Path) -> list[int]:
    """Lines of ``path`` comparing an expression's ``.dataset_type`` with ==, !=, in, not in."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(side, ast.Attribute) and side.attr == "dataset_type"
                   for side in sides):
                lines.append(node.lineno)
    return lines


class DatasetKindsTest(unittest.TestCase):
    def test_the_four_kinds_with_the_default_first(self):
        self.assertEqual(kind_names(), ("image", "conditioning", "eval", "video"))

    def test_each_kind_is_named_as_its_module(self):
        for name in kind_names():
            self.assertEqual(kind_named(name).name, name)

    def test_what_each_kind_says_of_itself(self):
        image, video = kind_named("image"), kind_named("video")
        evaluation, reference = kind_named("eval"), kind_named("conditioning")
        self.assertEqual([k.name for k in (image, video, evaluation, reference) if k.trains],
                         ["image", "video"])
        self.assertIn(".mp4", video.extensions)
        self.assertNotIn(".mp4", image.extensions)
        self.assertTrue(evaluation.evaluates and not image.evaluates)
        self.assertTrue(reference.is_reference and not reference.reads_caption_files)
        self.assertEqual((video.sample_noun, image.sample_noun), ("clip", "image"))

    def test_an_unknown_kind_names_the_known_ones(self):
        with self.assertRaisesRegex(ValueError, "'audio'.*image, conditioning, eval, video"):
            kind_named("audio")

    def test_kind_of_a_dataset_config(self):
        dataset = DatasetConfig(id="clips", instance_data_dir="/data", dataset_type="video")
        self.assertTrue(kind_of(dataset).has_clips)

    def test_no_dataset_type_comparison_outside_the_kinds(self):
        found = []
        for path in sorted(PACKAGE.rglob("*.py")):
            if COMPARISONS_ALLOWED & {path.name, *path.relative_to(PACKAGE).parts}:
                continue
            found += [f"{path.relative_to(PACKAGE)}:{line}"
                      for line in dataset_type_comparisons(path)]
        self.assertEqual(found, [])


if __name__ == "__main__":
    unittest.main()
