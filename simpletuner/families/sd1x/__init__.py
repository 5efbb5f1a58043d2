"""Stable Diffusion 1.x: spec.py, adapter.py, tiny.py."""
