"""Stable Diffusion 2.x: spec.py, adapter.py (SD 1.x's layout), tiny.py."""
