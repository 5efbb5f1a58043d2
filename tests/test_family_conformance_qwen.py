"""The conformance suite (tests/conformance.py) for Qwen-Image (and its edit flavours) and Z-Image."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("qwen_image", "z_image")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
