"""The conformance suite (tests/conformance.py) for LTX-Video 0.9.x and LTX-2."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("ltxvideo", "ltxvideo2")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
