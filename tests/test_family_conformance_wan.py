"""The conformance suite (tests/conformance.py) for Wan 2.1 (T2V, I2V) and Wan 2.2 (A14B,
TI2V-5B)."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("wan",)

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
