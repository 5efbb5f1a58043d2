"""SANA-Video: spec.py, adapter.py and tiny.py."""
