"""The conformance suite (tests/conformance.py) for FLUX.1 (and Kontext), Chroma and FLUX.2."""

from __future__ import annotations

import unittest

from conformance import case_classes

FAMILIES = ("flux", "chroma", "flux2")

globals().update(case_classes(__name__, FAMILIES))


if __name__ == "__main__":
    unittest.main()
