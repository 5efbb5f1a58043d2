"""Importing what a run imports prints none of the libraries' noise about backends this machine
cannot use, while those loggers' other warnings still show."""

from __future__ import annotations

import sys
import tempfile
import unittest

from launching import run_bounded

# What torchao logs on a CPU build when its CUDA libraries do not load, and what transformers
# logs when an image processor falls back to PIL without torchvision: the noise of every start.
IMPORTS = "import torchao; from transformers import CLIPImageProcessor"
NOISE = ("Failed to load ", "requires torchvision (not installed)")
KEPT = "import logging; logging.getLogger('torchao').warning('torchao says something real')"


class QuietLibrariesTest(unittest.TestCase):
    def stderr_of(self, code: str) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_bounded([sys.executable, "-c", code], tmpdir=tmp, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return result.stderr

    def test_the_noise_shows_without_the_package_and_not_with_it(self):
        bare = self.stderr_of(IMPORTS)
        for text in NOISE:  # else this machine has no such noise and the test proves nothing
            self.assertIn(text, bare)
        quiet = self.stderr_of(f"import simpletuner; {IMPORTS}; {KEPT}")
        for text in NOISE:
            self.assertNotIn(text, quiet)
        self.assertIn("torchao says something real", quiet)


if __name__ == "__main__":
    unittest.main()
