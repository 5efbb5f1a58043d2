"""Stable Diffusion 3: spec.py, adapter.py, tiny.py."""
