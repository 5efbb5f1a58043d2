"""HiDream-I1: spec.py, adapter.py, tiny.py."""
