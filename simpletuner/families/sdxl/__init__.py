"""SDXL: spec.py, adapter.py, tiny.py."""
