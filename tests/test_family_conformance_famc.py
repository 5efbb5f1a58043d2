"""The conformance suite (tests/conformance.py) for Kolors, HiDream-I1 and PixArt
Sigma."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("kolors", "hidream", "pixart_sigma")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
