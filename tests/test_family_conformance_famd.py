"""The conformance suite (tests/conformance.py) for Kandinsky 5.0 Image and LongCat-Image."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("kandinsky5_image", "longcat_image")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
