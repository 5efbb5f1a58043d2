"""The conformance suite (tests/conformance.py) for Kolors and HiDream-I1."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("kolors", "hidream")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
