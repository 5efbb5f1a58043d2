"""Kolors: spec.py, adapter.py, tiny.py."""
