"""Sana: spec.py, adapter.py, tiny.py."""
