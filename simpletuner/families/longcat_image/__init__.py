"""LongCat-Image: spec.py, adapter.py, tiny.py."""
