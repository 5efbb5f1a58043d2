"""Krea 2: spec.py, adapter.py, tiny.py."""
