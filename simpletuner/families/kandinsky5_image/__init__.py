"""Kandinsky 5.0 Image: spec.py, adapter.py, tiny.py."""
