"""The conformance suite (tests/conformance.py) for the video families of issue 45's second
wave: HunyuanVideo 1.5 (text- and image-to-video) and SANA-Video."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("hunyuanvideo", "sanavideo")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
