"""Chroma: spec.py, adapter.py, tiny.py."""
