"""The conformance suite (tests/conformance.py) for the 2026 image families: Krea 2,
ERNIE-Image and Ideogram 4."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("krea2", "ernie", "ideogram")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
