"""Ideogram 4: spec.py, adapter.py, tiny.py."""
